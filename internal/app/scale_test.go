package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/connect"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// scaleConfig is a distributed config of n queues q0000.. with their target on up, the
// ingress's listeners and the worker's admin listener on free ports, and extra appended to the
// nats section.
func scaleConfig(t *testing.T, rs *testenv.RedisServer, natsURL, extra, up string, n int, queue string) (ingress, worker string) {
	t.Helper()
	var qs strings.Builder
	for i := range n {
		fmt.Fprintf(&qs, "  - {name: q%04d, rate: 100/s, target: POST %s/q%04d%s}\n", i, up, i, queue)
	}
	common := fmt.Sprintf("redis: { url: %q }\nnats: { url: %q%s }\nshutdown_timeout: 2s\nqueues:\n%s", rs.URL(), natsURL, extra, qs.String())
	ingress = fmt.Sprintf("listen: %s\nadmin_listen: %s\n%s", freeAddr(t), freeAddr(t), common)
	worker = fmt.Sprintf("admin_listen: %s\n%s", freeAddr(t), common)
	return ingress, worker
}

// runScaleWorker runs app.Worker on the config text cfg until the test ends; ready is closed once
// it drains.
func runScaleWorker(t *testing.T, cfg string) (ready chan struct{}, done chan error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "worker.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready, done = make(chan struct{}), make(chan error, 1)
	go func() {
		done <- Worker{ConfigPath: path, Logger: testLogger(), Ready: func(string) { close(ready) }}.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("worker did not stop within 15s")
		}
	})
	return ready, done
}

// readyz reads /readyz of the admin listener at addr: its status and the checks that failed.
func readyz(t *testing.T, addr string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var body struct{ Checks map[string]string }
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("/readyz of %s: %v", addr, err)
	}
	var failed []string
	for name, v := range body.Checks {
		if v != "ok" {
			failed = append(failed, name+": "+v)
		}
	}
	return resp.StatusCode, strings.Join(failed, "; ")
}

// waitReadyz waits up to d for /readyz of addr to answer want, and returns what it said.
func waitReadyz(t *testing.T, addr string, want int, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		code, why := readyz(t, addr)
		if code == want {
			return why
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz of %s: %d (%s) after %v, want %d", addr, code, why, d, want)
		}
		time.Sleep(20 * time.Millisecond) // polling an HTTP endpoint: nothing to wait on
	}
}

// adminOf is the admin_listen of a config text.
func adminOf(cfg string) string {
	for line := range strings.Lines(cfg) {
		if a, ok := strings.CutPrefix(line, "admin_listen: "); ok {
			return strings.TrimSpace(a)
		}
	}
	return ""
}

// Many queues on a NATS server with its stock store limit (75% of the free disk, as
// `nats-server -js -sd DIR` sets it): with max_bytes unset nothing is reserved, every queue
// comes up in the ingress and the worker, and a job on the last queue is delivered at once
// (issue 44). With the earlier default of 256 MiB reserved per queue, 400 queues needed 100 GiB
// of store and most failed with err 10047. Both ways a plain queue keeps its jobs: the shared
// streams (the default) and a stream per queue (shared_streams: 0).
func TestManyQueuesOnStockStore(t *testing.T) {
	for _, mode := range []struct{ name, extra string }{{"shared", ""}, {"own", ", shared_streams: 0"}} {
		t.Run(mode.name, func(t *testing.T) { manyQueuesOnStockStore(t, mode.extra) })
	}
}

// manyQueuesOnStockStore is TestManyQueuesOnStockStore with extra in the nats section.
func manyQueuesOnStockStore(t *testing.T, extra string) {
	const n = 400
	rs := testenv.Redis(t)
	ns := testenv.NATS(t, testenv.StockStore())
	up := workertest.NewRecorder(t)
	icfg, wcfg := scaleConfig(t, rs, ns.URL, extra, up.URL, n, "")
	began := time.Now()
	ing := start(t, t.TempDir(), icfg)
	wready, wdone := runScaleWorker(t, wcfg)
	waitReadyz(t, ing.admin, http.StatusOK, 20*time.Second)
	select {
	case <-wready:
	case err := <-wdone:
		t.Fatalf("worker exited: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("worker not draining after 20s")
	}
	waitReadyz(t, adminOf(wcfg), http.StatusOK, 5*time.Second)
	t.Logf("%d queues: ingress and worker ready %v after start", n, time.Since(began).Round(time.Millisecond))
	if _, store, err := ns.Server.JetStreamReservedResources(); err != nil || store != 0 {
		t.Errorf("store reserved %d bytes (%v), want 0: queues without max_bytes reserve nothing", store, err)
	}

	sent := time.Now()
	last := fmt.Sprintf("q%04d", n-1)
	resp, err := http.Post("http://"+ing.listen+"/v1/queues/"+last+"/jobs", "text/plain", strings.NewReader("last"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST to %s: %d, want 202", last, resp.StatusCode)
	}
	up.WaitCount(t, 10*time.Second, "the job on the last queue", func(n int) bool { return n >= 1 })
	t.Logf("job on %s at the upstream %v after its POST", last, time.Since(sent).Round(time.Millisecond))
}

// A queue whose stream cannot be provisioned (the store cannot reserve its max_bytes) keeps the
// ingress's and the worker's /readyz at 503, naming the queue and the fix; once the store has
// room both turn 200 without a restart (issue 44).
func TestReadyzNamesQueueThatCannotBeProvisioned(t *testing.T) {
	rs := testenv.Redis(t)
	ns := testenv.NATS(t, testenv.MaxStore(64<<20))
	js, err := jetstream.New(testenv.Connect(t, ns.URL))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Another tenant of the server holds most of its store.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OTHER", Subjects: []string{"other"},
		MaxBytes: 60 << 20, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	up := workertest.NewRecorder(t)
	icfg, wcfg := scaleConfig(t, rs, ns.URL, "", up.URL, 2, ", max_bytes: 8388608")
	ing := start(t, t.TempDir(), icfg)
	_, wdone := runScaleWorker(t, wcfg)
	for proc, addr := range map[string]string{"ingress": ing.admin, "worker": adminOf(wcfg)} {
		why := waitReadyz(t, addr, http.StatusServiceUnavailable, 10*time.Second)
		for waitFor := time.Now().Add(10 * time.Second); !strings.Contains(why, "cannot be provisioned"); {
			if time.Now().After(waitFor) {
				t.Fatalf("%s /readyz: %q, want it to name the queue that cannot be provisioned", proc, why)
			}
			time.Sleep(20 * time.Millisecond)
			_, why = readyz(t, addr)
		}
		for _, want := range []string{`queues cannot be provisioned ("q000`, "max_bytes", "nats.store_budget", "max_file_store"} {
			if !strings.Contains(why, want) {
				t.Errorf("%s /readyz: %q, want it to say %q", proc, why, want)
			}
		}
	}
	if err := js.DeleteStream(ctx, "OTHER"); err != nil {
		t.Fatal(err)
	}
	waitReadyz(t, ing.admin, http.StatusOK, 10*time.Second)
	waitReadyz(t, adminOf(wcfg), http.StatusOK, 10*time.Second)
	select {
	case err := <-wdone:
		t.Fatalf("worker exited: %v", err)
	default:
	}
}

// nats.replicas above 1 against a server that runs JetStream without a cluster cannot work
// until the config or the servers change: both processes stop at once with a config error that
// says the fix (issues 44 and 45), instead of retrying and answering 503 for ever.
func TestReplicasWithoutClusterFailFast(t *testing.T) {
	rs := testenv.Redis(t)
	ns := testenv.NATS(t)
	icfg, wcfg := scaleConfig(t, rs, ns.URL, ", replicas: 3", "http://127.0.0.1:1", 1, "")
	dir := t.TempDir()
	ipath, wpath := filepath.Join(dir, "ingress.yaml"), filepath.Join(dir, "worker.yaml")
	for path, cfg := range map[string]string{ipath: icfg, wpath: wcfg} {
		if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for proc, run := range map[string]func(context.Context) error{
		"ingress": Ingress{ConfigPath: ipath, Logger: testLogger()}.Run,
		"worker":  Worker{ConfigPath: wpath, Logger: testLogger()}.Run,
	} {
		began := time.Now()
		err := run(ctx)
		if ctx.Err() != nil {
			t.Fatalf("%s still running after 10s, want it to stop at once", proc)
		}
		if err == nil || !errors.Is(err, connect.ErrConfig) || !strings.Contains(err.Error(), "set nats.replicas: 1 or run a cluster") {
			t.Errorf("%s: %v, want a config error saying to set nats.replicas: 1 or run a cluster", proc, err)
		}
		t.Logf("%s stopped after %v: %v", proc, time.Since(began).Round(time.Millisecond), err)
	}
}
