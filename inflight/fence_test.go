package inflight

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// The fence after a loss of state, against a real redis-server: FLUSHALL stands in for a
// restart without persistence (TestFenceRestart kills and restarts the server once).

// losses counts the losses a store reported through WithOnLoss.
type losses struct{ n atomic.Int64 }

func (l *losses) option() RedisOption { return WithOnLoss(func(string) { l.n.Add(1) }) }

// fenceStores returns two stores over two clients of srv with one prefix (two processes),
// each counting its losses.
func fenceStores(t *testing.T, srv *testenv.RedisServer, opts ...RedisOption) (a, b *Redis, la, lb *losses) {
	t.Helper()
	la, lb = &losses{}, &losses{}
	prefix := WithPrefix(testenv.Prefix(t))
	a = NewRedis(srv.NewClient(), append([]RedisOption{prefix, la.option()}, opts...)...)
	b = NewRedis(srv.NewClient(), append([]RedisOption{prefix, lb.option()}, opts...)...)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b, la, lb
}

// TestFenceFirstUse: the first use of a cap is not fenced, nor is a store that never knew an
// epoch after a FLUSHALL (it cannot tell a loss from a first use: a new deployment delivers at
// once); neither reports a loss.
func TestFenceFirstUse(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	a, _, la, _ := fenceStores(t, srv)
	caps := []Cap{{Key: "{f}:q", Limit: 5}}
	if r := ok(t)(a.Acquire(ctx, caps, time.Minute)); !r.Acquired {
		t.Fatalf("first Acquire ever: %+v; want acquired", r)
	}
	if err := srv.Client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	fresh := NewRedis(srv.NewClient(), WithPrefix(a.prefix))
	if r := ok(t)(fresh.Acquire(ctx, caps, time.Minute)); !r.Acquired {
		t.Fatalf("a fresh store after FLUSHALL: %+v; want acquired", r)
	}
	if n := la.n.Load(); n != 0 {
		t.Fatalf("%d losses reported before any", n)
	}
}

// TestFenceAfterFlush: a cap of 5 has its 5 places out (store a), another process (b) knows
// the cap, and Redis forgets everything. Then no place is granted until the fence (hold −
// margin from the loss) has passed; a re-asserts its 5 on its first call, so that even after
// the fence none is granted until a gives one back; the count never exceeds 5; each store
// reports the loss once.
func TestFenceAfterFlush(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	const hold, margin = 3 * time.Second, time.Second
	a, b, la, lb := fenceStores(t, srv, WithMargin(margin))
	caps := []Cap{{Key: "{f}:q", Limit: 5}}
	var held []Lease
	for range 5 {
		held = append(held, ok(t)(a.Acquire(ctx, caps, hold)).Lease)
	}
	if r := ok(t)(b.Acquire(ctx, caps, hold)); r.Acquired { // b learns the epoch
		t.Fatal("a sixth place granted")
	}
	if err := srv.Client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	lost := time.Now()
	r := ok(t)(b.Acquire(ctx, caps, hold))
	if r.Acquired || r.RetryAfter < hold-margin-100*time.Millisecond || r.RetryAfter > hold-margin {
		t.Fatalf("b's first Acquire after the loss: %+v; want refused for the fence of %v", r, hold-margin)
	}
	if r := ok(t)(a.Acquire(ctx, caps, hold)); r.Acquired || r.RetryAfter <= 0 {
		t.Fatalf("a's first Acquire after the loss: %+v; want refused by the fence", r)
	}
	if n := inFlight(t, b, "{f}:q"); n[0] != 5 {
		t.Fatalf("in flight after a re-asserted its places: %v, want 5", n)
	}
	// Until the fence passes and after, b is refused: the 5 are counted again.
	for time.Since(lost) < hold-margin+300*time.Millisecond {
		if r := ok(t)(b.Acquire(ctx, caps, hold)); r.Acquired {
			t.Fatalf("a place granted %v after the loss, over 5 re-asserted ones", time.Since(lost))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := inFlight(t, b, "{f}:q"); n[0] != 5 {
		t.Fatalf("in flight after the fence: %v, want 5", n)
	}
	for _, l := range held[:2] {
		if err := a.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		if r := ok(t)(b.Acquire(ctx, caps, hold)); !r.Acquired || r.InFlight[0] > 5 {
			t.Fatalf("place %d after two were given back: %+v", i, r)
		}
	}
	if r := ok(t)(b.Acquire(ctx, caps, hold)); r.Acquired {
		t.Fatal("a sixth place granted after the fence")
	}
	if la.n.Load() != 1 || lb.n.Load() != 1 {
		t.Fatalf("losses reported: a %d, b %d; want 1 each", la.n.Load(), lb.n.Load())
	}
}

// TestFenceHolderGone: the holder of the 5 places never calls again (it crashed with the
// server, or is stuck mid-request): the process that learns of the loss is refused until the
// fence has passed, measured from the loss, and then gets the cap's 5 places.
func TestFenceHolderGone(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	const hold = 1500 * time.Millisecond
	a, b, _, lb := fenceStores(t, srv)
	caps := []Cap{{Key: "{g}:q", Limit: 5}}
	for range 5 {
		ok(t)(a.Acquire(ctx, caps, hold))
	}
	ok(t)(b.Acquire(ctx, caps, hold))
	if err := srv.Client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	lost := time.Now()
	var first time.Duration
	for got := 0; got < 5; {
		r := ok(t)(b.Acquire(ctx, caps, hold))
		if r.Acquired {
			if got == 0 {
				first = time.Since(lost)
			}
			got++
			continue
		}
		if time.Since(lost) > hold+2*time.Second {
			t.Fatalf("%d places after %v; the fence is %v", got, time.Since(lost), hold)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if first < hold {
		t.Fatalf("the first place after the loss granted after %v, before the fence of %v", first, hold)
	}
	t.Logf("first place granted %v after the loss (fence %v)", first, hold)
	if lb.n.Load() != 1 {
		t.Fatalf("b reported %d losses, want 1", lb.n.Load())
	}
}

// TestFenceRenewRelease: after a loss, a lease's Renew puts it back while the fence stands
// (and renews it), and a Release of a lost lease frees nothing of another's; a lease whose
// store learns of the loss only after the fence is given up: its Renew reports false.
func TestFenceRenewRelease(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	const hold = 1200 * time.Millisecond
	a, b, _, _ := fenceStores(t, srv)
	caps := []Cap{{Key: "{r}:q", Limit: 2}}
	l1 := ok(t)(a.Acquire(ctx, caps, hold)).Lease
	l2 := ok(t)(b.Acquire(ctx, caps, hold)).Lease
	if err := srv.Client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if renewed, err := a.Renew(ctx, l1, hold); err != nil || !renewed {
		t.Fatalf("Renew of a lease lost with the server's state, under the fence: %v, %v; want true", renewed, err)
	}
	if n := inFlight(t, a, "{r}:q"); n[0] != 1 {
		t.Fatalf("in flight after a re-asserted and renewed its lease: %v, want 1", n)
	}
	// b learns of the loss only once the fence is over: its lease is given up, not put back.
	time.Sleep(hold + 100*time.Millisecond) // the fence, on the server's clock
	if renewed, err := b.Renew(ctx, l2, hold); err != nil || renewed {
		t.Fatalf("Renew after the fence of a lease not re-asserted: %v, %v; want false", renewed, err)
	}
	if err := b.Release(ctx, l2); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, l1); err != nil {
		t.Fatal(err)
	}
	if n := inFlight(t, a, "{r}:q"); n[0] != 0 {
		t.Fatalf("in flight after both releases: %v, want 0", n)
	}
}

// TestFenceRestart: the same over a real restart of redis-server (killed, started again with
// an empty dataset): the holder re-asserts, the other process is fenced.
func TestFenceRestart(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	const hold = 2 * time.Second
	a, b, la, lb := fenceStores(t, srv)
	caps := []Cap{{Key: "{k}:q", Limit: 3}}
	var held []Lease
	for range 3 {
		held = append(held, ok(t)(a.Acquire(ctx, caps, hold)).Lease)
	}
	ok(t)(b.Acquire(ctx, caps, hold))
	srv.Stop()
	srv.Start()
	var r Result
	testenv.WaitFor(t, 5*time.Second, "b to reach the restarted server", func() bool {
		var err error
		r, err = b.Acquire(ctx, caps, hold)
		return err == nil
	})
	if r.Acquired {
		t.Fatalf("b after the restart: %+v; want refused", r)
	}
	testenv.WaitFor(t, 5*time.Second, "a to reach the restarted server", func() bool {
		_, err := a.Acquire(ctx, caps, hold)
		return err == nil
	})
	if n := inFlight(t, a, "{k}:q"); n[0] != 3 {
		t.Fatalf("in flight after the restart and a's re-assertion: %v, want 3", n)
	}
	for _, l := range held {
		a.Release(ctx, l)
	}
	if la.n.Load() != 1 || lb.n.Load() != 1 {
		t.Fatalf("losses reported: a %d, b %d; want 1 each", la.n.Load(), lb.n.Load())
	}
}

// TestFenceNeverExceeded: 16 goroutines on two stores (two processes) take places of a cap of
// 4 through Wait and hold each a few milliseconds, while Redis forgets everything twice; the
// places held at once, counted between acquire and release, never exceed 4, and the cap is
// used again after each fence.
func TestFenceNeverExceeded(t *testing.T) {
	srv := testenv.Redis(t)
	const limit, hold = 4, 800 * time.Millisecond
	a, b, la, lb := fenceStores(t, srv, WithRecheck(50*time.Millisecond))
	caps := []Cap{{Key: "{n}:q", Limit: limit}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var held, high, served atomic.Int64
	var wg sync.WaitGroup
	for w := range 16 {
		s := a
		if w%2 == 1 {
			s = b
		}
		wg.Go(func() {
			for ctx.Err() == nil {
				res, err := s.Wait(ctx, caps, hold)
				if err != nil {
					return
				}
				n := held.Add(1)
				for h := high.Load(); n > h && !high.CompareAndSwap(h, n); h = high.Load() {
				}
				served.Add(1)
				time.Sleep(3 * time.Millisecond)
				held.Add(-1)
				s.Release(context.Background(), res.Lease)
			}
		})
	}
	for range 2 {
		testenv.WaitFor(t, 5*time.Second, "deliveries", func() bool { return served.Load() > 20 })
		if err := srv.Client.FlushAll(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		served.Store(0)
		time.Sleep(200 * time.Millisecond)
	}
	testenv.WaitFor(t, 5*time.Second, "deliveries after the fence", func() bool { return served.Load() > 20 })
	cancel()
	wg.Wait()
	if h := high.Load(); h > limit {
		t.Fatalf("%d places held at once under a cap of %d across two losses", h, limit)
	}
	if la.n.Load()+lb.n.Load() < 2 {
		t.Fatalf("losses reported: a %d, b %d; want the two seen", la.n.Load(), lb.n.Load())
	}
	t.Logf("high-water mark %d of %d; losses reported a %d, b %d", high.Load(), limit, la.n.Load(), lb.n.Load())
}

// TestFenceReuserKeptPlaces: places a Reuser keeps for its next holders are still leases of
// its store: after a loss they are given to holders without a round trip, and put back in
// Redis on the store's first call, so the other process counts them when the fence ends.
func TestFenceReuserKeptPlaces(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	a, b, _, _ := fenceStores(t, srv)
	r := Reuse(a, time.Second, time.Minute) // places kept unused for a minute: no give-back here
	t.Cleanup(func() { r.Close(context.Background()) })
	caps := []Cap{{Key: "{u}:q", Limit: 3}}
	const hold = time.Second
	first := ok(t)(r.Acquire(ctx, caps, hold))
	second := ok(t)(r.Acquire(ctx, caps, hold))
	ok(t)(b.Acquire(ctx, caps, hold)) // b learns the epoch, and takes the third place
	r.Release(ctx, first.Lease)       // kept by the Reuser
	r.Release(ctx, second.Lease)
	if err := srv.Client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if res := ok(t)(b.Acquire(ctx, caps, hold)); res.Acquired {
		t.Fatalf("b after the loss: %+v; want refused by the fence", res)
	}
	for i := range 2 { // the kept places, no round trip
		if res := ok(t)(r.Acquire(ctx, caps, hold)); !res.Acquired {
			t.Fatalf("kept place %d: %+v", i, res)
		}
	}
	if res := ok(t)(r.Acquire(ctx, caps, hold)); res.Acquired {
		t.Fatalf("a third place through the Reuser under the fence: %+v", res)
	}
	if n := inFlight(t, b, "{u}:q"); n[0] != 3 {
		t.Fatalf("in flight after the Reuser's store learned of the loss: %v, want its 2 places and b's put back", n)
	}
}
