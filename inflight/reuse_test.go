package inflight

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// reusers returns two Reusers, each over its own Redis store of one server (two processes),
// and the round trips their clients make.
func reusers(t *testing.T, opts ...RedisOption) (a, b *Reuser, trips *atomic.Int64) {
	t.Helper()
	srv := testenv.Redis(t)
	rt := &roundTrips{}
	opts = append([]RedisOption{WithPrefix(testenv.Prefix(t))}, opts...)
	var out [2]*Reuser
	for i := range out {
		rdb := srv.NewClient()
		rdb.AddHook(rt)
		s := NewRedis(rdb, opts...)
		out[i] = Reuse(s, 0, 0)
		t.Cleanup(func() { out[i].Close(context.Background()); s.Close() })
	}
	return out[0], out[1], &rt.n
}

// TestReuseNeverExceeded: 32 goroutines in two Reusers take and give back places through
// Wait. Under a cap they reach (4) and one they do not (64), no place is held by two holders
// at once, the cap is never exceeded, and every Wait is served; under the cap not reached,
// places are given again without round trips; once idle, every place is back in the store.
func TestReuseNeverExceeded(t *testing.T) {
	for _, c := range []struct {
		limit    int64
		fewTrips bool
	}{{4, false}, {64, true}} {
		a, b, trips := reusers(t)
		const workers, rounds = 32, 20
		caps := []Cap{{Key: "{c}:conns", Limit: c.limit}}
		var holders sync.Map // lease id → struct{} while a holder has it
		high := hammer(t, a, b, caps, workers, rounds, func(res Result) error {
			if _, dup := holders.LoadOrStore(res.Lease.ID, struct{}{}); dup {
				return errors.New("a place given to two holders at once")
			}
			return nil
		}, func(res Result) { holders.Delete(res.Lease.ID) })
		if high > c.limit {
			t.Fatalf("cap %d: %d places held at once", c.limit, high)
		}
		perPlace := float64(trips.Load()) / workers / rounds
		t.Logf("cap %d: %.2f round trips per place", c.limit, perPlace)
		// Without reuse a place costs 2 (its take and its give-back). On a quiet machine this
		// runs at about 0.2; beside two CPU-bound loops, since the epoch check (the fence after
		// a Redis state loss), it reaches 0.5–0.8 in about a third of runs (BENCHMARKS.md,
		// "inflight"): the bound asks that at least half the places be given again.
		if c.fewTrips && perPlace > 1 {
			t.Fatalf("cap %d, not reached: %.2f round trips per place, want places given again without", c.limit, perPlace)
		}
		testenv.WaitFor(t, 5*time.Second, "the kept places to go back", func() bool {
			return inFlight(t, a, "{c}:conns")[0] == 0
		})
	}
}

// TestReuseOnlyWhenUncontended: a place whose cap was full after its taking goes back to the
// store at its release, and so does one released while a Wait of the same caps is blocked
// in the store, which it wakes at once; a place of an uncontended cap is kept, and given to
// the next holder of exactly the same caps.
func TestReuseOnlyWhenUncontended(t *testing.T) {
	a, _, _ := reusers(t, WithRecheck(time.Minute))
	ctx := context.Background()

	one := []Cap{{Key: "{u}:one", Limit: 1}}
	r := ok(t)(a.Wait(ctx, one, time.Minute))
	if err := a.Release(ctx, r.Lease); err != nil {
		t.Fatal(err)
	}
	if n := inFlight(t, a, "{u}:one"); n[0] != 0 {
		t.Fatalf("a place of a full cap kept: %d in flight after its release", n[0])
	}

	// A clock of the test's own: kept places go back only when the test moves it (the idle
	// sweep finds none idle), so the blocked Wait is served by the release alone.
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	a.mu.Lock()
	a.now = func() time.Time { return time.Unix(0, now.Load()) }
	a.mu.Unlock()
	two := []Cap{{Key: "{u}:two", Limit: 2}}
	first := ok(t)(a.Wait(ctx, two, time.Minute)) // 1 of 2: reusable
	second := ok(t)(a.Wait(ctx, two, time.Minute))
	got := make(chan Result, 1)
	go func() { got <- ok(t)(a.Wait(ctx, two, time.Minute)) }()
	testenv.WaitFor(t, 5*time.Second, "the Wait to block", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.waiting[capsID(two)]) == 1 && waiting(a.s) == 1
	})
	now.Add(int64(blocked)) // the Wait has been refused for a while
	if err := a.Release(ctx, first.Lease); err != nil {
		t.Fatal(err)
	}
	select {
	case third := <-got:
		if third.Lease.ID == first.Lease.ID {
			t.Fatal("the blocked Wait got the kept place, not one of the store")
		}
		if err := a.Release(ctx, third.Lease); err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a release while a Wait was blocked did not wake it (kept instead)")
	}
	if err := a.Release(ctx, second.Lease); err != nil {
		t.Fatal(err)
	}

	many := []Cap{{Key: "{u}:many", Limit: 10}}
	r = ok(t)(a.Wait(ctx, many, time.Minute))
	if err := a.Release(ctx, r.Lease); err != nil {
		t.Fatal(err)
	}
	if n := inFlight(t, a, "{u}:many"); n[0] != 1 {
		t.Fatalf("in flight %d after releasing an uncontended place; want it kept (1)", n[0])
	}
	other := []Cap{{Key: "{u}:many", Limit: 9}} // a changed limit takes a place anew
	o := ok(t)(a.Wait(ctx, other, time.Minute))
	if o.Lease.ID == r.Lease.ID {
		t.Fatal("a kept place given to caps of another limit")
	}
	again := ok(t)(a.Wait(ctx, many, time.Minute))
	if again.Lease.ID != r.Lease.ID {
		t.Fatal("the kept place was not given to the next holder of the same caps")
	}
	for _, l := range []Lease{o.Lease, again.Lease} {
		if err := a.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := inFlight(t, a, "{u}:many"); n[0] != 0 {
		t.Fatalf("in flight %d after Close", n[0])
	}
}

// TestReuseHoldAhead: a kept place is given again only while the hold asked is still ahead
// of it in the store, which is the hold it was taken for plus Spare; past that it goes back
// and a new place is taken.
func TestReuseHoldAhead(t *testing.T) {
	a, _, _ := reusers(t)
	ctx := context.Background()
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	a.now = func() time.Time { return time.Unix(0, now.Load()) }
	caps := []Cap{{Key: "{h}:k", Limit: 10}}
	hold := time.Minute
	r := ok(t)(a.Wait(ctx, caps, hold))
	if err := a.Release(ctx, r.Lease); err != nil {
		t.Fatal(err)
	}
	now.Add(int64(DefaultSpare / 2))
	again := ok(t)(a.Wait(ctx, caps, hold))
	if again.Lease.ID != r.Lease.ID {
		t.Fatal("a kept place with the hold still ahead was not given again")
	}
	if err := a.Release(ctx, again.Lease); err != nil {
		t.Fatal(err)
	}
	now.Add(int64(DefaultSpare))
	fresh := ok(t)(a.Wait(ctx, caps, hold))
	if fresh.Lease.ID == r.Lease.ID {
		t.Fatal("a kept place given again with less than its hold ahead")
	}
	testenv.WaitFor(t, 5*time.Second, "the old place to go back", func() bool {
		return inFlight(t, a, "{h}:k")[0] == 1
	})
	if err := a.Release(ctx, fresh.Lease); err != nil {
		t.Fatal(err)
	}
}
