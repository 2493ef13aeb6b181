package app

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
	"github.com/sluice-rl/sluice/queue"
	"github.com/sluice-rl/sluice/retry"
)

// The SDK against the real thing: an ingress and a worker sharing real Redis and NATS servers.
// 1000 jobs are submitted through a tight limit on submissions, so many submissions are
// answered 429 and retried by the SDK with their idempotency key; every job succeeds, and the
// upstream receives each exactly once.
//
// The limit binds however slow the machine: its burst is 2, so three of the 16 submitters'
// requests that arrive within 6.7 ms (two intervals of 1/300 s) are one refused, which even 20
// submissions a second do dozens of times in 1000. With burst 20 the limit bound only while
// the submitters offered more than 300/s: beside other builds a run admitted all 1 016
// submissions in 20 s, none refused. (Burst 1 bound too, but each refusal costs its submitter
// the 1 s of Retry-After, and the test took twice as long.)
func TestClientThroughIngressAndWorker(t *testing.T) {
	const n = 1000
	rdb := testenv.Redis(t)
	ns := testenv.NATS(t)
	up := workertest.NewRecorder(t)
	dir := t.TempDir()
	listen := freeAddr(t)
	file := func(admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
redis: { url: %s }
nats: { url: %s }
store_timeout: 1s # a busy machine's slow Redis call must not fail open here: the limit has to bind
queues:
  - name: orders
    rate: 1000/s
    target: POST %s/orders
    concurrency: 16
rules:
  - name: submissions-per-key
    match: { methods: [POST], path: /v1/queues/orders/jobs }
    key: [header:X-API-Key]
    algorithm: gcra
    limit: 300
    period: 1s
    burst: 2
`, listen, admin, up.URL, rdb.URL(), ns.URL, up.URL)
	}
	in := start(t, dir, file(freeAddr(t)))

	wpath := filepath.Join(dir, "worker.yaml")
	if err := os.WriteFile(wpath, []byte(file(freeAddr(t))), 0o644); err != nil {
		t.Fatal(err)
	}
	wctx, stopWorker := context.WithCancel(context.Background())
	workerDone := make(chan error, 1)
	go func() { workerDone <- Worker{ConfigPath: wpath, Logger: testLogger()}.Run(wctx) }()
	t.Cleanup(func() {
		stopWorker()
		if err := <-workerDone; err != nil {
			t.Errorf("worker: %v", err)
		}
	})

	c, err := client.New("http://"+in.listen, client.WithHeader("X-API-Key", "integration"),
		client.WithPolicy(retry.Policy{Initial: 50 * time.Millisecond, Max: time.Second, MaxAttempts: 50}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		ids      = map[string]bool{}
		failures atomic.Int64
	)
	// Submit everything first, faster than the limit allows, then wait for every job.
	submitted := make([]string, n)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 16 {
				job, err := c.Submit(ctx, "orders", []byte(fmt.Sprintf(`{"n":%d}`, i)))
				if err != nil {
					t.Errorf("submit %d: %v", i, err)
					failures.Add(1)
					return
				}
				submitted[i] = job.ID
			}
		}()
	}
	wg.Wait()
	if failures.Load() > 0 {
		t.FailNow()
	}
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 16 {
				job, err := c.Wait(ctx, submitted[i])
				if err != nil {
					t.Errorf("wait %s: %v", submitted[i], err)
					failures.Add(1)
					return
				}
				if job.State != client.StateSucceeded {
					t.Errorf("job %s: %s", job.ID, job.State)
				}
				mu.Lock()
				ids[job.ID] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if failures.Load() > 0 {
		t.FailNow()
	}
	if len(ids) != n {
		t.Fatalf("%d distinct jobs succeeded, want %d", len(ids), n)
	}
	per := up.PerID()
	dups := 0
	for id := range ids {
		switch per[id] {
		case 1:
		case 0:
			t.Errorf("job %s succeeded but the upstream never saw it", id)
		default:
			dups++
		}
	}
	if dups > 0 || up.Count() != n {
		t.Fatalf("upstream saw %d requests for %d jobs, %d jobs more than once", up.Count(), n, dups)
	}
	// The limit was tight: submissions were refused and retried.
	resp, err := http.Get("http://" + in.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !hasPositive(string(metrics), `sluice_decisions_total{outcome="rejected",rule="submissions-per-key"}`) {
		t.Fatalf("no submission was rejected; the limit did not bind:\n%s", grep(string(metrics), "sluice_decisions_total"))
	}
	t.Logf("%s; %s", grep(string(metrics), `{outcome="allowed",rule="submissions-per-key"}`),
		grep(string(metrics), `{outcome="rejected",rule="submissions-per-key"}`))
}

// Killing the nats-server process in the middle of a submission run, and starting it again, loses
// no job that was answered 202: every id the ingress acknowledged is in the stream afterwards.
func TestNoAcceptedJobLostWhenNATSRestarts(t *testing.T) {
	np := testenv.NATSProc(t)
	dir := t.TempDir()
	in := start(t, dir, fmt.Sprintf(`listen: %s
admin_listen: %s
nats: { url: %s }
queues:
  - { name: crash, rate: 1/s, target: "POST http://127.0.0.1:1/unused" }
`, freeAddr(t), freeAddr(t), np.URL))

	var (
		mu       sync.Mutex
		accepted = map[string]bool{}
		refused  atomic.Int64
		stop     atomic.Bool
		wg       sync.WaitGroup
	)
	hc := &http.Client{Timeout: 10 * time.Second}
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				resp, err := hc.Post("http://"+in.listen+"/v1/queues/crash/jobs", "text/plain",
					strings.NewReader(fmt.Sprintf("g%d-%d", g, i)))
				if err != nil {
					refused.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusAccepted {
					refused.Add(1)
					continue
				}
				id := strings.TrimPrefix(resp.Header.Get("Location"), "/v1/jobs/")
				mu.Lock()
				accepted[id] = true
				mu.Unlock()
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(accepted) }
	testenv.WaitFor(t, 30*time.Second, "300 jobs accepted before the crash", func() bool { return count() >= 300 })
	np.Kill()
	before := count()
	testenv.WaitFor(t, 30*time.Second, "submissions refused while NATS is down", func() bool { return refused.Load() > 0 })
	np.Start()
	testenv.WaitFor(t, 60*time.Second, "300 more jobs accepted after the restart", func() bool { return count() >= before+300 })
	stop.Store(true)
	wg.Wait()

	// Read every job in the stream.
	nc := testenv.Connect(t, np.URL)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cfg, err := config.Load(filepath.Join(dir, "sluice.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	qs, err := queue.New(ctx, js, QueueOptions(cfg))
	if err != nil {
		t.Fatal(err)
	}
	if err := qs.Provision(ctx, QueueSpecs(cfg)); err != nil {
		t.Fatal(err)
	}
	cons, err := qs.Consumer(ctx, "crash")
	if err != nil {
		t.Fatal(err)
	}
	inStream := map[string]bool{}
	for {
		msgs, err := cons.Fetch(ctx, 500, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) == 0 {
			break
		}
		for _, m := range msgs {
			inStream[m.Job.ID] = true
		}
	}
	lost := 0
	for id := range accepted {
		if !inStream[id] {
			lost++
		}
	}
	t.Logf("%d accepted (202), %d refused or failed, %d in the stream", len(accepted), refused.Load(), len(inStream))
	if lost > 0 {
		t.Fatalf("%d of %d jobs answered 202 are not in the stream", lost, len(accepted))
	}
}

func hasPositive(metrics, series string) bool {
	for _, l := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			return v != "0"
		}
	}
	return false
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
