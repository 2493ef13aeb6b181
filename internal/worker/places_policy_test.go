package worker

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/inflight"
	"github.com/sluice-rl/sluice/queue"
)

// TestPlacesAdmit: a job of a capped queue holds a place until its release; with the cap full
// the next waits, and is not sent when its queue stops first; a queue without caps holds none.
func TestPlacesAdmit(t *testing.T) {
	clock := newFakeClock()
	capped := &QueueConfig{Name: "q", MaxInFlight: 1, Timeout: time.Second}
	env := testEnv("q", func() *QueueConfig { return capped })
	env.now = clock.now
	store := inflight.NewMemory()
	p := &places{env: env, store: store, settling: context.Background()}

	if v := p.admit(context.Background(), &QueueConfig{Name: "q"}, testJob("free", "")); v.kind != admitGo || v.release != nil {
		t.Fatalf("uncapped: %+v, want go holding nothing", v)
	}
	first := p.admit(context.Background(), capped, testJob("a", ""))
	if first.kind != admitGo || first.release == nil || first.valid == nil {
		t.Fatalf("first job: %+v, want go holding a place", first)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if v := p.admit(ctx, capped, testJob("b", "")); v.kind != admitRefuse || v.end != endNotSent {
		t.Fatalf("cap full until the queue stops: %+v, want refused, not sent", v)
	}
	first.release()
	second := p.admit(context.Background(), capped, testJob("c", ""))
	if second.kind != admitGo {
		t.Fatalf("after the release: %+v, want go", second)
	}
	second.release()
	if n, err := store.InFlight(context.Background(), placeKey("q")); err != nil || n[0] != 0 {
		t.Fatalf("in flight after every release: %v, %v; want 0", n, err)
	}
}

// TestPlacesValid: places taken for a slot that came within slotBudget stand as they are; a
// later slot renews them, and a job whose places expired meanwhile takes both again.
func TestPlacesValid(t *testing.T) {
	clock := newFakeClock()
	cfg := &QueueConfig{Name: "q", MaxInFlight: 2, Timeout: time.Second}
	env := testEnv("q", func() *QueueConfig { return cfg })
	env.now = clock.now
	p := &places{env: env, store: inflight.NewMemory(), settling: context.Background()}
	for _, c := range []struct {
		name      string
		slotAfter time.Duration
		released  bool // the places went back meanwhile (expired)
		want      bool
	}{
		{"a slot at once", 0, false, true},
		{"a slot within slotBudget", slotBudget - time.Millisecond, false, true},
		{"a late slot renews", slotBudget + time.Second, false, true},
		{"a late slot after the places expired", slotBudget + time.Second, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := p.admit(context.Background(), cfg, testJob("j", ""))
			if v.kind != admitGo {
				t.Fatalf("admit = %+v", v)
			}
			defer v.release()
			if c.released {
				v.release()
			}
			clock.advance(c.slotAfter)
			if got := v.valid(); got != c.want {
				t.Fatalf("valid = %v, want %v", got, c.want)
			}
		})
	}
}

// TestPlacesCaps: the queue's cap, and in a fair queue its tenant's: the file's own setting for
// the tenant over tenant_in_flight, an operator's over both.
func TestPlacesCaps(t *testing.T) {
	for _, c := range []struct {
		name     string
		cfg      QueueConfig
		operator int64
		want     []inflight.Cap
	}{
		{"none", QueueConfig{}, 0, nil},
		{"the queue's", QueueConfig{MaxInFlight: 5}, 0, []inflight.Cap{{Key: "{q:q}", Limit: 5}}},
		{"a tenant's needs a fair queue", QueueConfig{TenantInFlight: 2}, 0, nil},
		{"tenant_in_flight", QueueConfig{Fair: true, TenantInFlight: 2}, 0, []inflight.Cap{{Key: "{q:q}:t:a", Limit: 2}}},
		{"the tenant's own", QueueConfig{Fair: true, TenantInFlight: 2, TenantInFlights: map[string]int64{"a": 3}}, 0,
			[]inflight.Cap{{Key: "{q:q}:t:a", Limit: 3}}},
		{"an operator's", QueueConfig{Fair: true, MaxInFlight: 9, TenantInFlights: map[string]int64{"a": 3}}, 4,
			[]inflight.Cap{{Key: "{q:q}", Limit: 9}, {Key: "{q:q}:t:a", Limit: 4}}},
	} {
		env := testEnv("q", func() *QueueConfig { return &c.cfg })
		env.control = func() queue.Control {
			return queue.Control{Tenants: map[string]queue.TenantControl{"a": {InFlight: c.operator}}}
		}
		got := (&places{env: env}).caps(&c.cfg, "a")
		if len(got) != len(c.want) {
			t.Errorf("%s: caps %+v, want %+v", c.name, got, c.want)
			continue
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("%s: caps %+v, want %+v", c.name, got, c.want)
			}
		}
	}
}

// flakyStore fails its first fails Releases, then gives the places back.
type flakyStore struct {
	placeStore
	mu       sync.Mutex
	fails    int
	calls    int
	released chan struct{}
}

func (f *flakyStore) Release(ctx context.Context, l inflight.Lease) error {
	f.mu.Lock()
	f.calls++
	failing := f.calls <= f.fails
	f.mu.Unlock()
	if failing {
		return errors.New("redis: i/o timeout")
	}
	close(f.released)
	return f.placeStore.Release(ctx, l)
}

// TestPlacesReleaseRetried: a release the store fails is tried again in the background until
// it lands, so a stalled store costs the cap no longer than the stall.
func TestPlacesReleaseRetried(t *testing.T) {
	cfg := &QueueConfig{Name: "q", MaxInFlight: 1, Timeout: time.Second}
	store := &flakyStore{placeStore: inflight.NewMemory(), fails: 3, released: make(chan struct{})}
	p := &places{env: testEnv("q", func() *QueueConfig { return cfg }), store: store, settling: context.Background()}
	v := p.admit(context.Background(), cfg, testJob("a", ""))
	if v.kind != admitGo {
		t.Fatalf("admit = %+v", v)
	}
	v.release() // fails at once; the background retries follow
	select {
	case <-store.released:
	case <-time.After(5 * time.Second):
		t.Fatal("the release never landed after the store came back")
	}
	if again := p.admit(context.Background(), cfg, testJob("b", "")); again.kind != admitGo {
		t.Fatalf("after the retried release: %+v, want the place again", again)
	}
}

// TestPlacesFollowTheStoreHealth: a job waiting for a place of a full cap goes back as soon as
// another job found the Pool's Redis down, without a failed call of its own; a job whose place
// store fails for storeGiveUp (each read of the clock here passing 500ms) goes back and marks
// the Pool down, so that it fetches no more.
func TestPlacesFollowTheStoreHealth(t *testing.T) {
	cfg := &QueueConfig{Name: "q", MaxInFlight: 1, Timeout: time.Second}
	env := testEnv("q", func() *QueueConfig { return cfg })
	health := &scheduleHealth{}
	p := &places{env: env, store: inflight.NewMemory(), settling: context.Background(), health: health}
	first := p.admit(context.Background(), cfg, testJob("a", ""))
	if first.kind != admitGo {
		t.Fatalf("first job: %+v, want go", first)
	}
	defer first.release()
	waited := make(chan verdict, 1)
	go func() { waited <- p.admit(context.Background(), cfg, testJob("b", "")) }()
	select {
	case v := <-waited:
		t.Fatalf("a job went with the cap full: %+v", v)
	case <-time.After(50 * time.Millisecond): // it waits for a place, as it should
	}
	health.down(env.log, time.Now(), errors.New("i/o timeout"))
	select {
	case v := <-waited:
		if v.kind != admitRefuse || v.end != endNotSent {
			t.Fatalf("the waiting job once the Pool found Redis down: %+v, want refused, not sent", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting job still waits after the Pool found Redis down")
	}
	health.up(env.log)

	clock := newFakeClock()
	env.now = func() time.Time { clock.advance(500 * time.Millisecond); return clock.now() }
	failing := &places{env: env, store: failingPlaces{}, settling: context.Background(), health: health}
	if v := failing.admit(context.Background(), cfg, testJob("c", "")); v.kind != admitRefuse || v.end != endNotSent {
		t.Fatalf("a failing place store: %+v, want refused, not sent", v)
	}
	if health.err() == nil {
		t.Fatal("a place store failing for storeGiveUp left the Pool up")
	}
}

// failingPlaces is a place store whose every call fails.
type failingPlaces struct{}

func (failingPlaces) Wait(context.Context, []inflight.Cap, time.Duration) (inflight.Result, error) {
	return inflight.Result{}, errors.New("i/o timeout")
}
func (failingPlaces) Release(context.Context, inflight.Lease) error { return errors.New("i/o timeout") }
func (failingPlaces) Renew(context.Context, inflight.Lease, time.Duration) (bool, error) {
	return false, errors.New("i/o timeout")
}

// TestScheduleHealthBind: a bound context ends, with cause ErrScheduleDown, when the schedule
// is found down; one bound while it is down is not cut; after it answers again, binds hold.
func TestScheduleHealthBind(t *testing.T) {
	var h scheduleHealth
	log := testEnv("q", nil).log
	ctx, unbind := h.bind(context.Background())
	defer unbind()
	h.down(log, time.Now(), errors.New("i/o timeout"))
	select { // the cut runs in a goroutine of its own (context.AfterFunc)
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
	}
	if context.Cause(ctx) != ErrScheduleDown {
		t.Fatalf("bound context after down: %v, want cause %v", context.Cause(ctx), ErrScheduleDown)
	}
	during, unbind2 := h.bind(context.Background())
	defer unbind2()
	h.up(log)
	after, unbind3 := h.bind(context.Background())
	if during.Err() != nil || after.Err() != nil {
		t.Fatalf("bound while down: %v; after up: %v; want neither cut", during.Err(), after.Err())
	}
	unbind3()
	if context.Cause(after) == ErrScheduleDown {
		t.Fatal("unbind ended the context with ErrScheduleDown")
	}
}
