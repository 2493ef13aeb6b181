package worker_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/queue"
)

// sharedHarness is newHarness over a NATS server with its default store limits and a queue
// layer with shared streams.
func sharedHarness(t *testing.T, streams int, specs ...queue.Spec) *sharedH {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	srv := testenv.NATS(t, testenv.StockStore())
	js, err := jetstream.New(testenv.Connect(t, srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	prefix := testenv.Name(t)
	qs, err := queue.New(ctx, js, queue.Options{Prefix: prefix, SharedStreams: streams})
	if err != nil {
		t.Fatal(err)
	}
	if err := qs.Provision(ctx, specs); err != nil {
		t.Fatal(err)
	}
	return &sharedH{&harness{t: t, ctx: ctx, nats: srv, js: js, qs: qs, up: workertest.NewRecorder(t),
		sched: leaky.NewMemory(nil)}, prefix}
}

// sharedH is a harness and its queues' prefix.
type sharedH struct {
	*harness
	prefix string
}

// streamNames lists the streams of the harness's prefix.
func (h *sharedH) streamNames() []string {
	h.t.Helper()
	var out []string
	l := h.js.StreamNames(h.ctx)
	for n := range l.Name() {
		if rest, ok := strings.CutPrefix(n, h.prefix+"_"); ok {
			out = append(out, rest)
		}
	}
	if err := l.Err(); err != nil {
		h.t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// TestSharedQueues: plain queues keep their jobs in the shared streams and a queue with a
// max_bytes of its own its own stream, side by side; a job posted while no worker runs is
// counted in its queue's depth and delivered once a worker starts; a job on a queue that never
// had a runner is delivered at once; a shared queue's rate holds (at most rate+1 in any
// second); its runner stops when idle and starts again with the next job.
func TestSharedQueues(t *testing.T) {
	h := sharedHarness(t, 4, queue.Spec{Name: "a"}, queue.Spec{Name: "b"}, queue.Spec{Name: "own", MaxBytes: 1 << 20})
	if got := h.streamNames(); !slices.Equal(got, []string{"J_0", "J_1", "J_2", "J_3", "Q_own"}) {
		t.Fatalf("streams: %v, want the 4 shared ones and own's", got)
	}
	if !h.qs.Shared("a") || !h.qs.Shared("b") || h.qs.Shared("own") {
		t.Fatalf("shared: a %v, b %v, own %v", h.qs.Shared("a"), h.qs.Shared("b"), h.qs.Shared("own"))
	}
	// Posted before any worker runs: no consumer exists yet, the depth is the subjects'.
	early := workertest.Publish(t, h.qs, "a", 12, true)
	if in := h.info("a"); in.Depth != 12 {
		t.Fatalf("depth of a before any worker: %d, want 12", in.Depth)
	}
	counts, err := h.qs.Counts(h.ctx, false)
	if err != nil || counts["a"].Depth != 12 {
		t.Fatalf("counts: %v, %v; want a at 12", counts, err)
	}
	if st := h.status(early[0]); st.State != queue.StateQueued {
		t.Fatalf("status of a waiting job: %s", st.State)
	}

	const rate = 5
	p := h.runWith(worker.Deps{}, func(p *worker.Pool) { worker.SetIdleWait(p, 500*time.Millisecond) },
		h.spec("a", rate), h.spec("b", 100), h.spec("own", 100))
	select {
	case <-p.Started():
	case <-time.After(10 * time.Second):
		t.Fatalf("pool not started: %v", p.Ready())
	}
	// A queue that never had a job, and so no consumer and no runner: delivered at once.
	sent := time.Now()
	wake := workertest.Publish(t, h.qs, "b", 1, true)
	h.up.WaitCount(t, 5*time.Second, "b's job", func(int) bool { return h.up.PerID()[wake[0]] > 0 })
	t.Logf("a job on a queue without a runner reached the upstream in %s", time.Since(sent))
	own := workertest.Publish(t, h.qs, "own", 1, true)
	h.waitState(own[0], queue.StateSucceeded, 5*time.Second)

	for _, id := range early {
		h.waitState(id, queue.StateSucceeded, 10*time.Second)
	}
	var ts []time.Time
	for _, a := range h.up.Arrivals() {
		if slices.Contains(early, a.ID) {
			ts = append(ts, a.At)
		}
	}
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	if n := workertest.MaxWindow(ts, time.Second); n > rate+1 {
		t.Fatalf("%d of a's jobs in one second at rate %d/s", n, rate)
	}
	testenv.WaitFor(t, 5*time.Second, "a's depth to be 0", func() bool { return h.info("a").Depth == 0 })

	// Idle, the shared queues' runners stop; the next job starts one again.
	testenv.WaitFor(t, 10*time.Second, "the shared queues' runners to stop", func() bool {
		return slices.Equal(worker.Running(p.Pool), []string{"own"})
	})
	sent = time.Now()
	again := workertest.Publish(t, h.qs, "a", 1, true)
	h.waitState(again[0], queue.StateSucceeded, 5*time.Second)
	t.Logf("a job on a queue whose runner had stopped was delivered in %s", time.Since(sent))
}

// TestSharedRedeliveryKeepsRunner: a job the upstream fails is handed back with a delay
// longer than the runner's idle wait; no bell rings for its redelivery, so the runner must
// stay until the consumer holds nothing, and the job succeeds.
func TestSharedRedeliveryKeepsRunner(t *testing.T) {
	h := sharedHarness(t, 2, queue.Spec{Name: "r"})
	h.up.Respond(func(a workertest.Arrival, nth int) workertest.Reply {
		if nth == 1 {
			return workertest.Reply{Status: http.StatusServiceUnavailable, Header: http.Header{"Retry-After": {"1"}}}
		}
		return workertest.Reply{}
	})
	p := h.runWith(worker.Deps{}, func(p *worker.Pool) { worker.SetIdleWait(p, 200*time.Millisecond) }, h.spec("r", 100))
	<-p.Started()
	ids := workertest.Publish(t, h.qs, "r", 1, true)
	// Within the sweep's period: the runner, not a sweep, took the redelivery.
	st := h.waitState(ids[0], queue.StateSucceeded, 4*time.Second)
	if n := h.up.PerID()[ids[0]]; n != 2 {
		t.Fatalf("%d deliveries of the job, want 2 (one failed, one retried): %+v", n, st)
	}
}

// TestSharedManyQueuesStockStore: 500 queues on a NATS server with its default store limits
// come up as 16 streams, the workers are ready at once, and a job on any of them is delivered.
func TestSharedManyQueuesStockStore(t *testing.T) {
	const n = 500
	var specs []queue.Spec
	var cfgs []worker.QueueConfig
	h := sharedHarness(t, 16)
	for i := range n {
		name := fmt.Sprintf("q%03d", i)
		specs = append(specs, queue.Spec{Name: name})
		cfgs = append(cfgs, h.spec(name, 100))
	}
	start := time.Now()
	if err := h.qs.Provision(h.ctx, specs); err != nil {
		t.Fatal(err)
	}
	provisioned := time.Since(start)
	if got := len(h.streamNames()); got != 16 {
		t.Fatalf("%d streams for %d shared queues, want 16", got, n)
	}
	start = time.Now()
	p := h.run(worker.Deps{}, cfgs...)
	select {
	case <-p.Started():
	case <-time.After(10 * time.Second):
		t.Fatalf("pool of %d queues not started in 10s: %v", n, p.Ready())
	}
	ready := time.Since(start)
	if r := worker.Running(p.Pool); len(r) != 0 {
		t.Fatalf("%d runners of idle shared queues", len(r))
	}
	var ids []string
	for i := 0; i < n; i += 25 {
		ids = append(ids, workertest.Publish(t, h.qs, fmt.Sprintf("q%03d", i), 1, true)...)
	}
	for _, id := range ids {
		h.waitState(id, queue.StateSucceeded, 10*time.Second)
	}
	t.Logf("%d queues: provisioned in %s, workers ready in %s, %d jobs on %d queues delivered", n, provisioned, ready, len(ids), len(ids))
	if _, err := h.qs.Info(h.ctx, "nope"); !errors.Is(err, queue.ErrUnknownQueue) {
		t.Fatalf("info of an unknown queue: %v", err)
	}
}

// TestSharedReload: a shared queue added by a reload to a pool that had none is drained (its
// doorbell starts then), and one removed is no more.
func TestSharedReload(t *testing.T) {
	h := sharedHarness(t, 2, queue.Spec{Name: "own", MaxBytes: 1 << 20})
	p := h.run(worker.Deps{}, h.spec("own", 100))
	<-p.Started()
	if err := h.qs.Provision(h.ctx, []queue.Spec{{Name: "own", MaxBytes: 1 << 20}, {Name: "late"}}); err != nil {
		t.Fatal(err)
	}
	if err := p.Reload([]worker.QueueConfig{h.spec("own", 100), h.spec("late", 100)}); err != nil {
		t.Fatal(err)
	}
	ids := workertest.Publish(t, h.qs, "late", 3, true)
	for _, id := range ids {
		h.waitState(id, queue.StateSucceeded, 10*time.Second)
	}
	if err := p.Reload([]worker.QueueConfig{h.spec("own", 100)}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "late's runner to go", func() bool {
		return slices.Equal(worker.Running(p.Pool), []string{"own"})
	})
}

// deafQueues is the queue layer with a doorbell that never rings: every bell is lost.
type deafQueues struct{ *queue.Queues }

func (d deafQueues) Doorbell(func(string)) (func(), error) {
	return d.Queues.Doorbell(func(string) {})
}

// TestSharedLostBell: a job whose bell is lost (here: every bell) is still delivered, found by
// the worker's sweep within its period.
func TestSharedLostBell(t *testing.T) {
	h := sharedHarness(t, 2, queue.Spec{Name: "deaf"})
	p, err := worker.New(worker.Deps{Queues: deafQueues{h.qs}, Schedule: h.sched}, []worker.QueueConfig{h.spec("deaf", 100)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(h.ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	<-p.Started()
	sent := time.Now()
	ids := workertest.Publish(t, h.qs, "deaf", 1, true)
	h.waitState(ids[0], queue.StateSucceeded, 10*time.Second)
	t.Logf("a job whose bell was lost was delivered after %s", time.Since(sent))
}
