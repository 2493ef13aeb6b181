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
