package worker_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/queue"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testenv.ProxyLeaks()...) }

// harness is one in-process test's world: an embedded NATS server with the test's queues, a
// recording upstream, and pools run against them.
type harness struct {
	t     *testing.T
	ctx   context.Context
	nats  *testenv.NATSServer
	js    jetstream.JetStream
	qs    *queue.Queues
	up    *workertest.Recorder
	sched leaky.Schedule
}

// newHarness starts NATS and the upstream, and provisions specs (AckWait default 30s).
func newHarness(t *testing.T, specs ...queue.Spec) *harness {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	srv := testenv.NATS(t)
	nc := testenv.Connect(t, srv.URL)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	qs, err := queue.New(ctx, js, queue.Options{Prefix: testenv.Name(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := qs.Provision(ctx, specs); err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, ctx: ctx, nats: srv, js: js, qs: qs, up: workertest.NewRecorder(t),
		sched: leaky.NewMemory(nil)}
}

// running is a Pool running in the background.
type running struct {
	*worker.Pool
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

// run starts a Pool over specs; the test's cleanup stops it.
func (h *harness) run(deps worker.Deps, specs ...worker.QueueConfig) *running {
	h.t.Helper()
	return h.runWith(deps, nil, specs...)
}

// runWith is run, with configure (if not nil) applied to the Pool before it starts.
func (h *harness) runWith(deps worker.Deps, configure func(*worker.Pool), specs ...worker.QueueConfig) *running {
	h.t.Helper()
	reg := prometheus.NewRegistry()
	deps.Queues, deps.Registerer = h.qs, reg
	if deps.Schedule == nil {
		deps.Schedule = h.sched
	}
	p, err := worker.New(deps, specs)
	if err != nil {
		h.t.Fatal(err)
	}
	if configure != nil {
		configure(p)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Pool: p, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- p.Run(ctx) }()
	h.t.Cleanup(func() { r.stop(h.t) })
	return r
}

// stop cancels the pool and waits for Run to return, at most 20s.
func (r *running) stop(t testing.TB) time.Duration {
	t.Helper()
	start := time.Now()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok && err != nil {
			t.Errorf("Run: %v", err)
		}
		if ok {
			close(r.done)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return within 20s of cancel")
	}
	return time.Since(start)
}

// spec returns a queue config delivering to the harness's upstream at rate per second.
func (h *harness) spec(name string, rate int) worker.QueueConfig {
	return worker.QueueConfig{
		Name:            name,
		Rate:            leaky.Every(int64(rate), time.Second),
		Upstream:        h.up.URL,
		Target:          &worker.Target{Method: http.MethodPost, URL: h.up.URL + "/target/" + name},
		Backoff:         testBackoff,
		Timeout:         2 * time.Second,
		MaxAttempts:     config.DefaultMaxAttempts,
		Concurrency:     config.DefaultConcurrency,
		MaxPauseRetries: config.DefaultMaxPauseRetries,
		DefaultPause:    config.DefaultPause,
		AckWait:         config.DefaultAckWait,
	}
}

// status returns the status of job id.
func (h *harness) status(id string) queue.Status {
	h.t.Helper()
	st, err := h.qs.Status(h.ctx, id)
	if err != nil {
		h.t.Fatalf("status %s: %v", id, err)
	}
	return st
}

// waitState waits until job id reaches state.
func (h *harness) waitState(id string, state queue.State, timeout time.Duration) queue.Status {
	h.t.Helper()
	var st queue.Status
	testenv.WaitFor(h.t, timeout, fmt.Sprintf("job %s to be %s", id, state), func() bool {
		var err error
		st, err = h.qs.Status(h.ctx, id)
		return err == nil && st.State == state
	})
	return st
}

// info returns the queue's info.
func (h *harness) info(name string) queue.Info {
	h.t.Helper()
	in, err := h.qs.Info(h.ctx, name)
	if err != nil {
		h.t.Fatal(err)
	}
	return in
}

// fetchAndNak takes one job of queue name through its consumer and hands it back, so that the
// next delivery of it is a redelivery.
func (h *harness) fetchAndNak(name string) {
	h.t.Helper()
	c, err := h.qs.Consumer(h.ctx, name)
	if err != nil {
		h.t.Fatal(err)
	}
	msgs, err := c.Fetch(h.ctx, 1, 2*time.Second)
	if err != nil || len(msgs) != 1 {
		h.t.Fatalf("fetch: %d messages, %v", len(msgs), err)
	}
	if err := msgs[0].Nak(h.ctx); err != nil {
		h.t.Fatal(err)
	}
}

// mustConfig parses a config file's content.
func mustConfig(t testing.TB, yaml string) *config.Config {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(yaml), nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// metric reads a metric of reg; see testenv.Metric.
func metric(t testing.TB, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	return testenv.Metric(t, reg, name, labels...)
}
