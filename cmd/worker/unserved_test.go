package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/app"
	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
	"github.com/sluice-rl/sluice/queue"
)

// TestSharedThrottledBesideUnserved: a throttled queue on a shared stream keeps its rate at
// the upstream while the same stream holds a large backlog, tickets and all, of a queue that
// no worker serves and that keeps receiving jobs (docs/design/scale.md, "A throttled queue
// beside an unserved backlog").
//
// With nats.shared_streams: 1 every queue lands on one stream. 100 000 jobs of "unserved"
// (configured for the publisher, as an ingress has it, not for the workers) are stored
// through the queue layer, then a backlog of a throttled queue (200/s, burst 5), which 2
// worker processes drain for 6 s while "unserved" receives 20 more jobs a second. Before the
// fix, each change in the count of the stream's jobs that no consumer counts made every
// worker's 5 s sweep list the subjects of the whole stream, one per job (the walk), which
// nats-server computes under the stream's lock: 10.8 KB sent to the workers per job drained,
// against 0.6-1 KB after (the throttled queue alone). The test asserts, counted at the boundaries: nats-server sends the
// workers at most 4 KB per job of the throttled queue during the drain (with the control's,
// below, 1-1.4 KB were measured; each walk of the unserved backlog is ~4 MB);
// the drain's rate at the upstream is within 5% of its rate; no one-second window holds more
// than rate + burst + 1. The machine is shared (2 cores, other engineers' builds and tests:
// load averages of 15-20 were seen), which starves every drain alike, so a control queue of
// the same rate on a stream of its own drains beside it in the same worker processes, and
// the rate is asserted within 5% of the lower of the rate and the control's achieved rate;
// a run that misses is repeated with fresh queues, up to 3 attempts.
func TestSharedThrottledBesideUnserved(t *testing.T) {
	const (
		rate, burst = 200, 5
		jobs        = 6 * rate
		backlog     = 100_000
		tolerance   = 0.05
		perJob      = 4096 // bytes sent to the workers per job drained (two drains)
		trickle     = 20   // jobs a second to "unserved" during the drain
	)
	c := newCluster(t)
	mon := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	c.nats = testenv.NATSProcIn(t, t.TempDir(), "-m", mon[strings.LastIndexByte(mon, ':')+1:])
	up := startUpstream(t)
	js, err := jetstream.New(testenv.Connect(t, c.nats.URL))
	if err != nil {
		t.Fatal(err)
	}
	// The publisher's queue layer knows every queue, as an ingress does.
	pub, err := queue.New(c.ctx, js, queue.Options{SharedStreams: 1})
	if err != nil {
		t.Fatal(err)
	}
	paced := func(name string, extra ...string) string {
		return c.queueYAMLTo(up.URL, name, fmt.Sprintf("%d/s", rate),
			append([]string{fmt.Sprintf("burst: %d", burst), "concurrency: 16"}, extra...)...)
	}
	const ownStream = "max_bytes: 67108864" // keeps a stream of its own
	var all string
	for try := 1; try <= 3; try++ {
		all += paced(fmt.Sprintf("paced%d", try)) + paced(fmt.Sprintf("control%d", try), ownStream)
	}
	all += c.queueYAMLTo(up.URL, "unserved", "100/s", "max_depth: 1000000")
	c.writeShared(pub, "all.yaml", all)
	start := time.Now()
	publishMany(t, pub, "unserved", backlog, 64)
	t.Logf("%d jobs of unserved stored in %v", backlog, time.Since(start).Round(time.Millisecond))

	var table, problems []string
	for try := 1; try <= 3; try++ {
		name, control := fmt.Sprintf("paced%d", try), fmt.Sprintf("control%d", try)
		workertest.Publish(t, pub, name, jobs, true)
		workertest.Publish(t, pub, control, jobs, true)
		path := c.writeShared(nil, name+".yaml", paced(name)+paced(control, ownStream))
		stopPause, stopControl := c.holdPaused(name), c.holdPaused(control)
		procs := []*proc{spawn(t, path), spawn(t, path)}
		for _, p := range procs {
			p.waitReady()
		}
		// The workers' holds take every ticket of the ledgers when they subscribe, the
		// unserved queue's too: let that end before the drain.
		testenv.WaitFor(t, 30*time.Second, "the hold of unserved's ledger to deliver its tickets", func() bool {
			cons, err := js.PushConsumer(c.ctx, "SLUICE_L_unserved", "hold")
			if err != nil {
				return false
			}
			ci, err := cons.Info(c.ctx)
			return err == nil && ci.NumPending == 0
		})
		// Delivered is not yet written: wait until nats-server holds nothing for the workers.
		testenv.WaitFor(t, 30*time.Second, "nats-server to have written the holds' deliveries", func() bool {
			_, pending := workerConns(t, mon)
			return pending == 0
		})
		before, _ := workerConns(t, mon)
		stopPause()
		stopControl()
		stopTrickle := trickleTo(t, pub, "unserved", trickle)
		up.WaitCount(t, time.Duration(jobs/rate+30)*time.Second, "the throttled backlog to drain", func(int) bool {
			return len(up.Arrivals("/q/"+name)) >= jobs && len(up.Arrivals("/q/"+control)) >= jobs
		})
		stopTrickle()
		after, _ := workerConns(t, mon)
		sent := after - before
		for _, p := range procs {
			p.kill()
		}
		as := up.Arrivals("/q/" + name)
		if len(as) != jobs {
			t.Fatalf("%s: %d deliveries of %d jobs, want each once", name, len(as), jobs)
		}
		ts := workertest.Times(as)
		achieved := workertest.Rate(ts[burst:]) // the burst leaves at once: the steady rate after it
		controlRate := workertest.Rate(workertest.Times(up.Arrivals("/q/" + control))[burst:])
		want := (1 - tolerance) * min(rate, controlRate)
		window := workertest.MaxWindow(ts, time.Second)
		gap, at := workertest.Gaps(ts, time.Time{})
		table = append(table, fmt.Sprintf("| %d | %7.1f/s | %+6.2f%% | %7.1f/s | %4d | %v at +%v | %d |", try, achieved,
			100*(achieved-rate)/rate, controlRate, window, gap.Round(time.Millisecond), at.Sub(ts[0]).Round(time.Millisecond), sent/jobs))
		problems = problems[:0]
		if achieved < want || math.IsNaN(achieved) {
			problems = append(problems, fmt.Sprintf("%s: %.1f/s of %d/s beside the unserved backlog (the control on its own stream %.1f/s), want ≥ %.1f/s",
				name, achieved, rate, controlRate, want))
		}
		if sent > perJob*jobs {
			problems = append(problems, fmt.Sprintf("%s: nats-server sent the workers %d bytes during the drain, %d per job, want ≤ %d per job",
				name, sent, sent/jobs, perJob))
		}
		if window > rate+burst+1 {
			problems = append(problems, fmt.Sprintf("%s: a 1s window holds %d deliveries, want ≤ %d", name, window, rate+burst+1))
		}
		if len(problems) == 0 {
			break
		}
		t.Logf("attempt %d missed: %s", try, strings.Join(problems, "; "))
	}
	t.Logf("throttled drain at %d/s beside %d unserved jobs, 2 workers, shared_streams 1:\n| try | achieved | error | control (own stream) | largest 1-s window | max gap | bytes to the workers per job |\n%s",
		rate, backlog, strings.Join(table, "\n"))
	for _, p := range problems {
		t.Error(p)
	}
}

// writeShared writes config file name in the cluster's directory with queues and
// nats.shared_streams: 1, provisions its queues in qs unless qs is nil, and returns its path.
func (c *cluster) writeShared(qs *queue.Queues, name, queues string) string {
	c.t.Helper()
	path := filepath.Join(c.dir, name)
	c.writeConfig(path, queues)
	b, err := os.ReadFile(path)
	if err != nil {
		c.t.Fatal(err)
	}
	b = []byte(strings.Replace(string(b), "nats: { url: ", "nats: { shared_streams: 1, url: ", 1))
	if err := os.WriteFile(path, b, 0o644); err != nil {
		c.t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil || cfg.NATS.SharedStreams != 1 {
		c.t.Fatalf("config %s: %v", name, err)
	}
	if qs != nil {
		if err := qs.Provision(c.ctx, app.QueueSpecs(cfg)); err != nil {
			c.t.Fatal(err)
		}
	}
	return path
}

// publishMany stores n direct jobs of queue name through qs (its tickets and all), from
// workers publishing at once.
func publishMany(t testing.TB, qs *queue.Queues, name string, n, workers int) {
	t.Helper()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	next := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				_, err := qs.Publish(ctx, &queue.Job{Queue: name, Direct: true,
					Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte("u" + strconv.Itoa(i))})
				cancel()
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if first != nil {
		t.Fatalf("publish %s: %v", name, first)
	}
}

// trickleTo publishes perSecond jobs a second to queue name until the returned stop is called.
func trickleTo(t testing.TB, qs *queue.Queues, name string, perSecond int) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	errs := make(chan error, 1)
	go func() {
		defer close(exited)
		tick := time.NewTicker(time.Second / time.Duration(perSecond))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := qs.Publish(ctx, &queue.Job{Queue: name, Direct: true, Body: []byte("t" + strconv.Itoa(i))})
			cancel()
			if err != nil {
				errs <- err
				return
			}
		}
	}()
	return func() {
		close(done)
		<-exited
		select {
		case err := <-errs:
			t.Fatalf("publish to %s during the drain: %v", name, err)
		default:
		}
	}
}

// workerConns is what nats-server (monitoring on mon) has sent the open connections of worker
// processes, and what it holds for them, not yet written.
func workerConns(t testing.TB, mon string) (sent, pending uint64) {
	t.Helper()
	r, err := http.Get("http://" + mon + "/connz?limit=4096")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var z struct {
		Connections []struct {
			Name     string `json:"name"`
			OutBytes uint64 `json:"out_bytes"`
			Pending  uint64 `json:"pending_bytes"`
		} `json:"connections"`
	}
	if err := json.NewDecoder(r.Body).Decode(&z); err != nil {
		t.Fatal(err)
	}
	for _, c := range z.Connections {
		if c.Name == "sluice-worker" {
			sent += c.OutBytes
			pending += c.Pending
		}
	}
	return sent, pending
}
