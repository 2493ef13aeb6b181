package fair_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
	"github.com/sluice-rl/sluice/queue/fair"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// bundle is what one test works with: a server, and a Queues whose names are unique to the
// test, with specs provisioned.
type bundle struct {
	t   testing.TB
	ctx context.Context
	js  jetstream.JetStream
	q   *queue.Queues
}

func setup(t testing.TB, specs ...queue.Spec) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	js, err := jetstream.New(testenv.Connect(t, testenv.NATS(t).URL))
	if err != nil {
		t.Fatal(err)
	}
	q, err := queue.New(ctx, js, queue.Options{Prefix: testenv.Name(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		q.Close(ctx)
	})
	if err := q.Provision(ctx, specs); err != nil {
		t.Fatal(err)
	}
	return &bundle{t: t, ctx: ctx, js: js, q: q}
}

// publishTenant publishes n jobs of tenant to queue name.
func (b *bundle) publishTenant(name, tenant string, n int) []string {
	b.t.Helper()
	ids := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := b.q.Publish(b.ctx, &queue.Job{Queue: name, Tenant: tenant, Method: "POST", Path: "/x", Body: fmt.Appendf(nil, "%s-%d", tenant, i)})
			if err != nil {
				errs <- err
				return
			}
			ids[i] = r.ID
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.t.Fatal(err)
	}
	return ids
}

// schedule runs a scheduler of queue name with opts until the returned function is called,
// which waits for Run to return.
func (b *bundle) schedule(name string, opts fair.Options) (stop func()) {
	b.t.Helper()
	s, err := fair.New(b.q, name, opts)
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	return func() { cancel(); <-done }
}

// drainFair runs a scheduler for queue name with opts and takes jobs one at a time until
// want jobs were taken, or a minute passed; it returns their tenants in delivery order.
func (b *bundle) drainFair(name string, opts fair.Options, want int) []string {
	b.t.Helper()
	defer b.schedule(name, opts)()
	cons, err := b.q.Consumer(b.ctx, name)
	if err != nil {
		b.t.Fatal(err)
	}
	var order []string
	deadline := time.Now().Add(time.Minute)
	for len(order) < want && time.Now().Before(deadline) {
		msgs, err := cons.Fetch(b.ctx, 1, 200*time.Millisecond)
		if err != nil {
			b.t.Fatal(err)
		}
		for _, m := range msgs {
			order = append(order, m.Job.Tenant)
			if err := m.Ack(b.ctx); err != nil {
				b.t.Fatal(err)
			}
		}
	}
	return order
}

// A tenant's few jobs behind another tenant's backlog wait only for the round robin.
func TestFairInterleavesTenants(t *testing.T) {
	b := setup(t, queue.Spec{Name: "shared", Fair: true})
	b.publishTenant("shared", "big", 300)
	b.publishTenant("shared", "small", 10)

	order := b.drainFair("shared", fair.Options{Target: 2}, 310)
	if len(order) != 310 {
		t.Fatalf("took %d jobs, want 310", len(order))
	}
	last := 0
	for i, tn := range order {
		if tn == "small" {
			last = i
		}
	}
	// Round robin: small's 10th job is at most ~20th, plus what the scheduler had moved before
	// small's backlog was first read.
	if last > 25 {
		t.Errorf("small's last job was delivery %d of 310, want <= 25 (FIFO: 309): %v", last+1, order[:30])
	}
}

// While both have jobs waiting, tenants get deliveries in proportion to their weights.
func TestFairWeights(t *testing.T) {
	b := setup(t, queue.Spec{Name: "w", Fair: true})
	b.publishTenant("w", "gold", 200)
	b.publishTenant("w", "plain", 200)

	order := b.drainFair("w", fair.Options{Target: 3, Weights: map[string]float64{"gold": 3}}, 200)
	counts := map[string]int{}
	for _, tn := range order[:200] {
		counts[tn]++
	}
	ratio := float64(counts["gold"]) / float64(counts["plain"])
	t.Logf("first 200 deliveries: %v (ratio %.2f)", counts, ratio)
	if ratio < 2.4 || ratio > 3.6 {
		t.Errorf("gold/plain = %.2f, want 3 ±20%%", ratio)
	}
}

// A fair queue's tenants are visible with their depths and delivered counts, and its jobs
// have a status from the moment they are accepted; a canceled waiting job is never delivered.
func TestFairVisibilityAndCancel(t *testing.T) {
	b := setup(t, queue.Spec{Name: "v", Fair: true})
	ids := b.publishTenant("v", "a", 5)
	b.publishTenant("v", "b", 2)
	b.publishTenant("v", "", 1)

	info, err := b.q.Info(b.ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	if !info.Fair || info.Depth != 8 || info.Backlog != 8 || info.Tenants != 3 {
		t.Fatalf("info = %+v, want fair, depth 8, backlog 8, 3 tenants", info)
	}
	if len(info.TopTenants) != 3 || info.TopTenants[0] != (queue.TenantDepth{Tenant: "a", Depth: 5}) {
		t.Fatalf("top tenants = %+v, want a (5) first", info.TopTenants)
	}
	st, err := b.q.Status(b.ctx, ids[0])
	if err != nil || st.State != queue.StateQueued {
		t.Fatalf("status of a waiting job = %+v, %v; want queued", st, err)
	}
	if _, err := b.q.Cancel(b.ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	ti, err := b.q.Tenant(b.ctx, "v", "a")
	if err != nil || ti.Depth != 4 {
		t.Fatalf("tenant a = %+v, %v; want depth 4 after a cancel", ti, err)
	}

	order := b.drainFair("v", fair.Options{Target: 2}, 7)
	if len(order) != 7 {
		t.Fatalf("delivered %d jobs, want the 7 not canceled", len(order))
	}
	// The counts are written once a second, and on the scheduler's exit.
	ti, err = b.q.Tenant(b.ctx, "v", "a")
	if err != nil || ti.Depth != 0 || ti.Delivered != 4 {
		t.Fatalf("tenant a = %+v, %v; want depth 0, delivered 4", ti, err)
	}
	if _, err := b.q.Tenant(b.ctx, "nope", "a"); err == nil {
		t.Error("Tenant of an unknown queue: no error")
	}
}

// Two schedulers of one queue: one leads, and when it stops the other takes over; no job is
// moved twice or lost.
func TestFairLeaseTakeover(t *testing.T) {
	b := setup(t, queue.Spec{Name: "l", Fair: true})
	b.publishTenant("l", "a", 40)
	b.publishTenant("l", "b", 40)

	f1, _ := fair.New(b.q, "l", fair.Options{Target: 4})
	f2, _ := fair.New(b.q, "l", fair.Options{Target: 4})
	ctx1, cancel1 := context.WithCancel(b.ctx)
	ctx2, cancel2 := context.WithCancel(b.ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); f1.Run(ctx1) }()
	go func() { defer wg.Done(); f2.Run(ctx2) }()
	defer func() { cancel1(); cancel2(); wg.Wait() }()

	cons, err := b.q.Consumer(b.ctx, "l")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	deadline := time.Now().Add(30 * time.Second)
	for len(seen) < 80 && time.Now().Before(deadline) {
		msgs, err := cons.Fetch(b.ctx, 4, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if seen[m.Job.ID] {
				t.Errorf("job %s delivered twice", m.Job.ID)
			}
			seen[m.Job.ID] = true
			m.Ack(b.ctx)
		}
		if len(seen) == 20 {
			cancel1() // whichever leads, one of them stops
		}
		if len(seen) == 50 {
			cancel2()
			ctx3, cancel3 := context.WithCancel(b.ctx)
			f3, _ := fair.New(b.q, "l", fair.Options{Target: 4})
			wg.Add(1)
			go func() { defer wg.Done(); f3.Run(ctx3) }()
			defer cancel3()
		}
	}
	if len(seen) != 80 {
		t.Fatalf("delivered %d distinct jobs, want 80", len(seen))
	}
}

// A queue that was fair and no longer is still has its tenants' backlogs moved on.
func TestFairDrainAfterFairIsOff(t *testing.T) {
	b := setup(t, queue.Spec{Name: "off", Fair: true})
	b.publishTenant("off", "a", 6)
	if err := b.q.Provision(b.ctx, []queue.Spec{{Name: "off"}}); err != nil {
		t.Fatal(err)
	}
	b.publishTenant("off", "a", 2) // now straight to the delivery stream
	if _, err := fair.New(b.q, "off", fair.Options{}); !errors.Is(err, queue.ErrUnknownQueue) {
		t.Fatalf("a scheduler for a queue that is not fair, without Drain: %v; want ErrUnknownQueue", err)
	}
	order := b.drainFair("off", fair.Options{Drain: true}, 8)
	if len(order) != 8 {
		t.Fatalf("took %d jobs, want 8", len(order))
	}
}

// A fair queue's dead letter replays into its tenant's backlog, and is delivered from there
// under its own id.
func TestFairReplayIntoTheBacklog(t *testing.T) {
	b := setup(t, queue.Spec{Name: "r", Fair: true})
	ids := b.publishTenant("r", "a", 1)
	schedule := func() (stop func()) { return b.schedule("r", fair.Options{Target: 1}) }
	cons, err := b.q.Consumer(b.ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	take := func() *queue.Msg {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			if msgs, err := cons.Fetch(b.ctx, 1, 200*time.Millisecond); err != nil {
				t.Fatal(err)
			} else if len(msgs) == 1 {
				return msgs[0]
			}
		}
		t.Fatal("no job delivered")
		return nil
	}
	stop := schedule()
	m := take()
	stop()
	if err := b.q.DeadLetter(b.ctx, m, "upstream answered 400", 400, 1); err != nil {
		t.Fatal(err)
	}
	if err := b.q.Replay(b.ctx, "r", ids[0]); err != nil {
		t.Fatal(err)
	}
	if ti, err := b.q.Tenant(b.ctx, "r", "a"); err != nil || ti.Depth != 1 {
		t.Fatalf("tenant a after the replay: %+v, %v; want its job back in its backlog", ti, err)
	}
	if st, err := b.q.Status(b.ctx, ids[0]); err != nil || st.State != queue.StateQueued {
		t.Fatalf("status after the replay: %+v, %v", st, err)
	}
	defer schedule()()
	if m2 := take(); m2.Job.ID != ids[0] || m2.Job.Tenant != "a" {
		t.Fatalf("replayed job delivered as %s of %q, want %s of a", m2.Job.ID, m2.Job.Tenant, ids[0])
	}
}
