package worker

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/queue"
)

// A queue's fair scheduler policy follows its config: while the queue is fair it keeps the
// config's target of jobs in the delivery stream, no more; once the queue is no longer fair
// it drains what the tenants' backlogs still hold.
func TestScheduleLoopFollowsTheConfig(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(testenv.Connect(t, testenv.NATS(t).URL))
	if err != nil {
		t.Fatal(err)
	}
	qs, err := queue.New(ctx, js, queue.Options{Prefix: testenv.Name(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer qs.Close(ctx)
	if err := qs.Provision(ctx, []queue.Spec{{Name: "f", Fair: true}}); err != nil {
		t.Fatal(err)
	}
	publish := func(tenant string, n int) {
		for range n {
			if _, err := qs.Publish(ctx, &queue.Job{Queue: "f", Tenant: tenant, Method: "POST", Path: "/x"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish("a", 5)
	publish("b", 5)

	var current atomic.Pointer[QueueConfig]
	changed := make(chan struct{}, 1)
	env := testEnv("f", current.Load)
	env.until = func(ctx context.Context) bool {
		select {
		case <-changed:
			return true
		case <-ctx.Done():
			return false
		}
	}
	fs := newFairScheduler(env, qs, &tenantLearners{env: env}, func(string) bool { return false })
	cfg := &QueueConfig{Name: "f", Fair: true, Rate: leaky.Every(20, time.Second)}
	current.Store(cfg)
	target := fs.options(cfg).Target // 250ms at 20/s
	if target != 5 {
		t.Fatalf("target at 20/s = %d, want 5", target)
	}
	lctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); fs.run(lctx) }()
	defer func() { stop(); <-done }()

	info := func() queue.Info {
		t.Helper()
		in, err := qs.Info(ctx, "f")
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	// The backlog stream's count of a moved job drops a moment after the delivery stream's
	// rises: wait for both.
	testenv.WaitFor(t, 10*time.Second, "the scheduler fills the delivery stream to the target", func() bool {
		in := info()
		return in.Pending == uint64(target) && in.Backlog == uint64(10-target)
	})
	if in := info(); in.Backlog != uint64(10-target) || in.Pending != uint64(target) {
		t.Fatalf("with no worker: %d in the backlogs and %d in the delivery stream, want %d and %d",
			in.Backlog, in.Pending, 10-target, target)
	}

	// The queue stops being fair, with jobs still in its backlogs: a worker taking jobs gets
	// them all.
	if err := qs.Provision(ctx, []queue.Spec{{Name: "f"}}); err != nil {
		t.Fatal(err)
	}
	current.Store(&QueueConfig{Name: "f", Rate: leaky.Every(20, time.Second)})
	cons, err := qs.Consumer(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	took := 0
	testenv.WaitFor(t, 10*time.Second, "every job delivered", func() bool {
		msgs, err := cons.Fetch(ctx, 10, 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if err := m.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
		took += len(msgs)
		return took == 10
	})
	if in := info(); in.Depth != 0 {
		t.Fatalf("after the drain: depth %d, want 0", in.Depth)
	}
}

// A tenant's caps and weight come from the file's tenant_settings, an operator's settings
// replace them, and a learned rate never raises them.
func TestFairOptionsTenantSettings(t *testing.T) {
	cfg := mustConfigText(t, `
queues:
  - name: f
    rate: 50/s
    tenant: header:X-Tenant
    fair: true
    tenant_settings:
      a: { rate: 5/s, in_flight: 2 }
      b: { weight: 3 }
      c: { rate: 8/s }
`)
	id := func(k []byte) string { return "id-" + string(k) }
	qc := FromConfig(cfg, id)[0]
	if qc.TenantRates["id-a"] != 5 || qc.TenantInFlights["id-a"] != 2 || qc.Weights["id-b"] != 3 || qc.TenantRates["id-c"] != 8 {
		t.Fatalf("FromConfig: rates %v, in flight %v, weights %v", qc.TenantRates, qc.TenantInFlights, qc.Weights)
	}
	p := &Pool{log: slog.New(slog.DiscardHandler)}
	p.controls.Store(&map[string]queue.Control{"f": {Tenants: map[string]queue.TenantControl{
		"id-a": {Rate: "10/s"}, "id-b": {Weight: 0.5},
	}}})
	env := testEnv("f", func() *QueueConfig { return &qc })
	env.control = func() queue.Control { return p.control("f") }
	o := newFairScheduler(env, nil, &tenantLearners{env: env}, nil).options(&qc)
	if o.TenantRates["id-a"] != 10 || o.Weights["id-b"] != 0.5 || o.TenantRates["id-c"] != 8 {
		t.Fatalf("with an operator's settings: rates %v, weights %v; want a 10 (the operator's), b 0.5, c 8", o.TenantRates, o.Weights)
	}
	if caps := (&places{env: env}).caps(&qc, "id-a"); len(caps) != 1 || caps[0].Limit != 2 {
		t.Fatalf("a's places: %+v, want one cap of 2 (the file's in_flight)", caps)
	}
}

func mustConfigText(t *testing.T, yaml string) *config.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
