package worker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
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

// TestFormerMigration: the jobs waiting in a queue's own stream when it becomes shared are
// delivered, each once, before those posted after the switch, at the queue's one rate (at
// most rate+1 in any second across both streams), and its own stream is then retired. The
// reverse: a pool without shared streams drains the jobs left in the queue's shared stream,
// each once, and the queue's consumer there is deleted.
func TestFormerMigration(t *testing.T) {
	const rate = 20
	h := sharedHarness(t, 0, queue.Spec{Name: "m"})
	old := workertest.Publish(t, h.qs, "m", 15, true)
	on := h.with(2)
	if !on.qs.Shared("m") {
		t.Fatal(`"m" is not shared`)
	}
	spec := h.spec("m", rate)
	spec.Concurrency = 1 // one job in hand: the order of the deliveries is the order of the fetches
	p := on.run(worker.Deps{}, spec)
	<-p.Started()
	newer := workertest.Publish(t, on.qs, "m", 5, true)
	want := len(old) + len(newer)
	h.up.WaitCount(t, 20*time.Second, "every job delivered", func(int) bool { return h.up.Distinct() >= want })
	arr := h.up.Arrivals()
	if len(arr) != want {
		t.Errorf("%d deliveries of %d jobs", len(arr), want)
	}
	for i, a := range arr[:len(old)] {
		if !slices.Contains(old, a.ID) {
			t.Errorf("delivery %d is of %s, posted after the switch, before the jobs of the own stream", i, a.ID)
		}
	}
	if w := workertest.MaxWindow(workertest.Times(arr), time.Second); w > rate+1 {
		t.Errorf("a 1s window holds %d deliveries at %d/s", w, rate)
	}
	testenv.WaitFor(t, 10*time.Second, "the own stream to be retired", func() bool {
		_, err := h.js.Stream(h.ctx, h.prefix+"_Q_m")
		return errors.Is(err, jetstream.ErrStreamNotFound)
	})
	p.stop(t)

	// Back to a stream of its own: the jobs left in the shared stream go first.
	left := workertest.Publish(t, on.qs, "m", 6, true)
	off := h.with(0)
	p = off.run(worker.Deps{}, spec)
	<-p.Started()
	after := workertest.Publish(t, off.qs, "m", 3, true)
	want += len(left) + len(after)
	h.up.WaitCount(t, 20*time.Second, "every job delivered", func(int) bool { return h.up.Distinct() >= want })
	if n := h.up.Count(); n != want {
		t.Errorf("%d deliveries of %d jobs", n, want)
	}
	back := h.up.Arrivals()[want-len(left)-len(after):]
	for i, a := range back[:len(left)] {
		if !slices.Contains(left, a.ID) {
			t.Errorf("delivery %d after the switch back is of %s, not one left in the shared stream", i, a.ID)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "the queue's consumer on its former shared stream to be deleted", func() bool {
		l := h.js.ListStreams(h.ctx, jetstream.WithStreamListSubject(h.prefix+".j.>"))
		cons := 0
		for si := range l.Info() {
			if strings.HasPrefix(si.Config.Name, h.prefix+"_J_") {
				cons += si.State.Consumers
			}
		}
		return l.Err() == nil && cons == 0
	})
}

// with returns the harness over a queue layer of the same prefix with n shared streams (0:
// none), specs (default: queue "m") provisioned again: another configuration of the same
// deployment.
func (h *sharedH) with(n int, specs ...queue.Spec) *sharedH {
	h.t.Helper()
	qs, err := queue.New(h.ctx, h.js, queue.Options{Prefix: h.prefix, SharedStreams: n})
	if err != nil {
		h.t.Fatal(err)
	}
	if len(specs) == 0 {
		specs = []queue.Spec{{Name: "m"}}
	}
	if err := qs.Provision(h.ctx, specs); err != nil {
		h.t.Fatal(err)
	}
	c := *h.harness
	c.qs = qs
	return &sharedH{&c, h.prefix}
}

// TestSharedIdleConsumer: a shared queue's consumer is deleted by nats-server once no worker
// pulled from it for queue.SharedInactive (here 2s); the next job makes it again and is
// delivered. A consumer deleted under a running runner (by hand) is made again too, and the
// jobs stored meanwhile are delivered, each once.
func TestSharedIdleConsumer(t *testing.T) {
	was := queue.SharedInactive
	queue.SharedInactive = 2 * time.Second
	t.Cleanup(func() { queue.SharedInactive = was })
	h := sharedHarness(t, 2, queue.Spec{Name: "i"})
	p := h.runWith(worker.Deps{}, func(p *worker.Pool) { worker.SetIdleWait(p, 300*time.Millisecond) }, h.spec("i", 100))
	<-p.Started()
	first := workertest.Publish(t, h.qs, "i", 1, true)
	h.waitState(first[0], queue.StateSucceeded, 5*time.Second)
	consumers := func() int {
		l := h.js.ListStreams(h.ctx, jetstream.WithStreamListSubject(h.prefix+".j.>"))
		n := 0
		for si := range l.Info() {
			n += si.State.Consumers
		}
		if err := l.Err(); err != nil {
			t.Fatal(err)
		}
		return n
	}
	testenv.WaitFor(t, 15*time.Second, "the idle queue's consumer to be deleted", func() bool {
		return len(worker.Running(p.Pool)) == 0 && consumers() == 0
	})
	second := workertest.Publish(t, h.qs, "i", 3, true)
	for _, id := range second {
		h.waitState(id, queue.StateSucceeded, 5*time.Second)
	}

	// Deleted by hand while this process keeps its handle (less than SharedInactive/2 old),
	// under a runner in its long pull or one that a bell starts: made again by the runner.
	var stream string
	for k := range 2 {
		name := h.prefix + "_J_" + strconv.Itoa(k)
		if _, err := h.js.Consumer(h.ctx, name, "i"); err == nil {
			stream = name
		}
	}
	if stream == "" {
		t.Fatal("no consumer of i")
	}
	if err := h.js.DeleteConsumer(h.ctx, stream, "i"); err != nil {
		t.Fatal(err)
	}
	third := workertest.Publish(t, h.qs, "i", 3, true)
	for _, id := range third {
		h.waitState(id, queue.StateSucceeded, 10*time.Second)
	}
	if n, want := h.up.Count(), 7; n != want {
		t.Fatalf("%d deliveries of %d jobs", n, want)
	}
}

// TestFormerFairToShared: a fair queue's jobs wait in its tenants' backlogs when it stops
// being fair and becomes shared: its runner, started by the sweep, drains the backlogs into
// the shared stream and delivers every job once; its own former delivery stream is retired.
func TestFormerFairToShared(t *testing.T) {
	h := sharedHarness(t, 0, queue.Spec{Name: "f", Fair: true})
	var ids []string
	for i := range 10 {
		r, err := h.qs.Publish(h.ctx, &queue.Job{Queue: "f", Tenant: "t" + strconv.Itoa(i%2), Method: "POST", Path: "/x"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.ID)
	}
	on := h.with(2, queue.Spec{Name: "f"})
	if !on.qs.Shared("f") {
		t.Fatal(`"f" is not shared`)
	}
	p := on.run(worker.Deps{}, h.spec("f", 50))
	<-p.Started()
	for _, id := range ids {
		h.waitState(id, queue.StateSucceeded, 15*time.Second)
	}
	if n := h.up.Count(); n != len(ids) {
		t.Errorf("%d deliveries of %d jobs", n, len(ids))
	}
	testenv.WaitFor(t, 10*time.Second, "the own delivery stream to be retired", func() bool {
		_, err := h.js.Stream(h.ctx, h.prefix+"_Q_f")
		return errors.Is(err, jetstream.ErrStreamNotFound)
	})
}

// BenchmarkFormerMigration: 1 000 queues with a stream of their own, 2 jobs waiting in each,
// become shared (16 shared streams); two pools start on them. It reports the time from the
// start to every job delivered and to every own stream retired. Run it with
//
//	go test -run '^$' -bench FormerMigration -benchtime 1x ./internal/worker/
func BenchmarkFormerMigration(b *testing.B) {
	const n = 1000
	var specs []queue.Spec
	var cfgs []worker.QueueConfig
	for i := range n {
		specs = append(specs, queue.Spec{Name: fmt.Sprintf("q%04d", i)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	b.Cleanup(cancel)
	js, err := jetstream.New(testenv.Connect(b, testenv.NATS(b, testenv.StockStore()).URL))
	if err != nil {
		b.Fatal(err)
	}
	prefix := "bench"
	qs, err := queue.New(ctx, js, queue.Options{Prefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	if err := qs.Provision(ctx, specs); err != nil {
		b.Fatal(err)
	}
	h := &sharedH{&harness{ctx: ctx, js: js, qs: qs, up: workertest.NewRecorder(b), sched: leaky.NewMemory(nil)}, prefix}
	for _, s := range specs {
		workertest.Publish(b, h.qs, s.Name, 2, true)
		cfgs = append(cfgs, h.spec(s.Name, 100))
	}
	on, err := queue.New(h.ctx, h.js, queue.Options{Prefix: h.prefix, SharedStreams: 16})
	if err != nil {
		b.Fatal(err)
	}
	if err := on.Provision(h.ctx, specs); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	for range 2 {
		p, err := worker.New(worker.Deps{Queues: on, Schedule: h.sched}, cfgs)
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(h.ctx)
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		b.Cleanup(func() { cancel(); <-done })
	}
	h.up.WaitCount(b, 2*time.Minute, "every job delivered", func(int) bool { return h.up.Distinct() >= 2*n })
	delivered := time.Since(start)
	if arr := h.up.Arrivals(); len(arr) > 0 {
		ts := workertest.Times(arr)
		for _, q := range []int{1, 10, 50, 90, 99} {
			b.Logf("p%d delivery at %s", q, ts[len(ts)*q/100].Sub(start))
		}
	}
	testenv.WaitFor(b, 2*time.Minute, "every own stream retired", func() bool {
		names := 0
		l := h.js.StreamNames(h.ctx, jetstream.WithStreamListSubject(h.prefix+".>"))
		for name := range l.Name() {
			if strings.HasPrefix(name, h.prefix+"_Q_") {
				names++
			}
		}
		return l.Err() == nil && names == 0
	})
	retired := time.Since(start)
	if c := h.up.Count(); c != 2*n {
		b.Errorf("%d deliveries of %d jobs", c, 2*n)
	}
	b.ReportMetric(delivered.Seconds(), "s-delivered")
	b.ReportMetric(retired.Seconds(), "s-retired")
	b.Logf("%d queues × 2 jobs moved to 16 shared streams, 2 pools: every job delivered in %s, every own stream retired in %s", n, delivered, retired)
}
