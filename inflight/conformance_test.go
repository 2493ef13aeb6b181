package inflight

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// The conformance suite: every store passes the same tests. A driver returns two stores that
// share their places — for Redis two NewRedis over two clients, as two processes would have;
// for Memory the one store twice — and the keys of a test carry one hash tag, as callers'
// keys of one Acquire must.

// pairFunc returns two stores over the same places, with a fresh prefix; opts configure
// Redis stores.
type pairFunc func(t *testing.T, opts ...RedisOption) (a, b Store)

// driver starts a store's server, once for every case of the suite.
type driver struct {
	name  string
	start func(t *testing.T) pairFunc
}

func drivers() []driver {
	redisPair := func(newClient func() redis.UniversalClient) pairFunc {
		return func(t *testing.T, opts ...RedisOption) (Store, Store) {
			opts = append([]RedisOption{WithPrefix(testenv.Prefix(t))}, opts...)
			a, b := NewRedis(newClient(), opts...), NewRedis(newClient(), opts...)
			t.Cleanup(func() { a.Close(); b.Close() })
			return a, b
		}
	}
	return []driver{
		{"memory", func(*testing.T) pairFunc {
			return func(*testing.T, ...RedisOption) (Store, Store) {
				m := NewMemory()
				return m, m
			}
		}},
		{"redis", func(t *testing.T) pairFunc {
			srv := testenv.Redis(t)
			return redisPair(func() redis.UniversalClient { return srv.NewClient() })
		}},
		{"redis-cluster", func(t *testing.T) pairFunc {
			c := cluster(t)
			return redisPair(func() redis.UniversalClient { return c.NewClient() })
		}},
	}
}

func cluster(t *testing.T) *testenv.RedisClusterServer {
	t.Helper()
	if testing.Short() {
		t.Skip("Redis Cluster: not in -short")
	}
	return testenv.RedisCluster(t)
}

// TestConformance runs every case against every store.
func TestConformance(t *testing.T) {
	cases := []struct {
		name string
		f    func(t *testing.T, pair pairFunc)
	}{
		{"NeverExceeded", testNeverExceeded},
		{"AllOrNothing", testAllOrNothing},
		{"Expiry", testExpiry},
		{"ReleaseWakesWait", testReleaseWakesWait},
		{"WakePassedOn", testWakePassedOn},
		{"WaitCanceled", testWaitCanceled},
		{"ReleaseIsIdempotent", testReleaseIsIdempotent},
		{"Invalid", testInvalid},
		{"Renew", testRenew},
	}
	for _, d := range drivers() {
		t.Run(d.name, func(t *testing.T) {
			pair := d.start(t)
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) { c.f(t, pair) })
			}
		})
	}
}

// ok returns res, failing the test on err: ok(t)(s.Acquire(…)).
func ok(t testing.TB) func(res Result, err error) Result {
	return func(res Result, err error) Result {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
}

func inFlight(t *testing.T, s Store, keys ...string) []int64 {
	t.Helper()
	n, err := s.InFlight(context.Background(), keys...)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// testNeverExceeded: 32 goroutines on two stores (two processes) take and give back
// places of a cap of 4 through Wait; the places held at once, counted with an atomic between
// acquire and release, never exceed 4, and every Wait is served.
func testNeverExceeded(t *testing.T, pair pairFunc) {
	a, b := pair(t)
	const limit, workers, rounds = 4, 32, 15
	caps := []Cap{{Key: "{c}:conns", Limit: limit}}
	high := hammer(t, a, b, caps, workers, rounds, func(res Result) error {
		if res.InFlight[0] < 1 || res.InFlight[0] > limit {
			return errors.New("InFlight out of range")
		}
		return nil
	}, nil)
	if high > limit || high < 2 {
		t.Fatalf("high-water mark of places held at once: %d; want 2..%d", high, limit)
	}
	t.Logf("high-water mark %d of a cap of %d", high, limit)
	if n := inFlight(t, a, "{c}:conns"); n[0] != 0 {
		t.Fatalf("in flight after every release: %d", n[0])
	}
}

// hammer runs workers goroutines, half on a and half on b, each taking a place of caps
// through Wait, holding it a millisecond and giving it back, rounds times; check sees each
// Wait's Result once its place is taken, and letGo (when not nil) just before it is given
// back. It fails t on an error or a Wait not served, and returns the most places held at
// once, counted with an atomic between acquire and release.
func hammer(t *testing.T, a, b Store, caps []Cap, workers, rounds int, check func(Result) error, letGo func(Result)) int64 {
	t.Helper()
	var held, high, served atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		s := a
		if w%2 == 1 {
			s = b
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for range rounds {
				res, err := s.Wait(ctx, caps, 30*time.Second)
				if err != nil {
					errs <- err
					return
				}
				n := held.Add(1)
				for h := high.Load(); n > h && !high.CompareAndSwap(h, n); h = high.Load() {
				}
				if err := check(res); err != nil {
					errs <- err
				}
				served.Add(1)
				time.Sleep(time.Millisecond) // the request the place is for
				held.Add(-1)
				if letGo != nil {
					letGo(res)
				}
				if err := s.Release(ctx, res.Lease); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := served.Load(); n != int64(workers*rounds) {
		t.Fatalf("served %d waits, want %d", n, workers*rounds)
	}
	return high.Load()
}

// testAllOrNothing: an Acquire over two caps takes a place of both or of neither.
func testAllOrNothing(t *testing.T, pair pairFunc) {
	s, _ := pair(t)
	ctx := context.Background()
	tenant := Cap{Key: "{t}:tenant", Limit: 1}
	queue := Cap{Key: "{t}:queue", Limit: 2}

	first := ok(t)(s.Acquire(ctx, []Cap{tenant}, time.Minute))
	if !first.Acquired || !equal(first.InFlight, []int64{1}) {
		t.Fatalf("first: %+v", first)
	}
	refused := ok(t)(s.Acquire(ctx, []Cap{queue, tenant}, time.Minute))
	if refused.Acquired || !equal(refused.InFlight, []int64{0, 1}) || refused.Lease.ID != "" {
		t.Fatalf("tenant full: %+v; want refused, in flight [0 1]", refused)
	}
	if refused.RetryAfter <= 50*time.Second || refused.RetryAfter > time.Minute {
		t.Fatalf("RetryAfter %v; want the tenant's place's expiry, under a minute", refused.RetryAfter)
	}
	if n := inFlight(t, s, "{t}:queue", "{t}:tenant"); !equal(n, []int64{0, 1}) {
		t.Fatalf("a refused Acquire took a place: in flight %v", n)
	}
	if err := s.Release(ctx, first.Lease); err != nil {
		t.Fatal(err)
	}
	both := ok(t)(s.Acquire(ctx, []Cap{queue, tenant}, time.Minute))
	if !both.Acquired || !equal(both.InFlight, []int64{1, 1}) || len(both.Lease.Keys) != 2 {
		t.Fatalf("both: %+v", both)
	}
	// The queue has room for one more, the tenant none: a third key of the same Acquire
	// is not taken either.
	other := Cap{Key: "{t}:other", Limit: 5}
	if r := ok(t)(s.Acquire(ctx, []Cap{other, queue, tenant}, time.Minute)); r.Acquired || !equal(r.InFlight, []int64{0, 1, 1}) {
		t.Fatalf("tenant full again: %+v", r)
	}
	if n := inFlight(t, s, "{t}:other", "{t}:queue"); !equal(n, []int64{0, 1}) {
		t.Fatalf("in flight %v, want [0 1]", n)
	}
	if err := s.Release(ctx, both.Lease); err != nil {
		t.Fatal(err)
	}
	if n := inFlight(t, s, "{t}:queue", "{t}:tenant"); !equal(n, []int64{0, 0}) {
		t.Fatalf("after release: %v", n)
	}
}

// testExpiry: a place held for hold comes back after hold and not before, and is
// not counted once expired.
func testExpiry(t *testing.T, pair pairFunc) {
	a, b := pair(t)
	ctx := context.Background()
	const hold = 300 * time.Millisecond
	caps := []Cap{{Key: "{e}:k", Limit: 1}}
	start := time.Now()
	ok(t)(a.Acquire(ctx, caps, hold))
	r := ok(t)(b.Acquire(ctx, caps, hold))
	if r.Acquired || r.RetryAfter <= 0 || r.RetryAfter > hold {
		t.Fatalf("second Acquire: %+v; want refused with 0 < RetryAfter <= %v", r, hold)
	}
	var got Result
	testenv.WaitFor(t, 5*time.Second, "the expired place to be taken again", func() bool {
		got = ok(t)(b.Acquire(ctx, caps, time.Minute))
		return got.Acquired
	})
	// The place expired at the server's (or store's) clock at least hold after start:
	// allow for the microsecond the Redis clock is truncated to.
	if e := time.Since(start); e < hold-time.Microsecond {
		t.Fatalf("the place came back %v after it was taken, before its hold of %v", e, hold)
	}
	if !equal(got.InFlight, []int64{1}) {
		t.Fatalf("in flight after the expired place was dropped: %v", got.InFlight)
	}
	if n := inFlight(t, a, "{e}:k"); n[0] != 1 {
		t.Fatalf("InFlight %v, want [1]", n)
	}
	if err := b.Release(ctx, got.Lease); err != nil {
		t.Fatal(err)
	}
}

// testReleaseWakesWait: a Release in one store wakes a Wait in the other (another
// process, for Redis) long before its fallback re-check, which is set to a minute here.
func testReleaseWakesWait(t *testing.T, pair pairFunc) {
	a, b := pair(t, WithRecheck(time.Minute))
	ctx := context.Background()
	caps := []Cap{{Key: "{w}:k", Limit: 1}}
	held := ok(t)(a.Acquire(ctx, caps, time.Minute))
	type out struct {
		res Result
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := b.Wait(ctx, caps, time.Minute)
		done <- out{res, err}
	}()
	testenv.WaitFor(t, 5*time.Second, "the Wait to block", func() bool { return waiting(b) == 1 })
	select {
	case o := <-done:
		t.Fatalf("Wait returned while the place was held: %+v, %v", o.res, o.err)
	default:
	}
	released := time.Now()
	if err := a.Release(ctx, held.Lease); err != nil {
		t.Fatal(err)
	}
	select {
	case o := <-done:
		if o.err != nil || !o.res.Acquired {
			t.Fatalf("Wait: %+v, %v", o.res, o.err)
		}
		t.Logf("woken %v after the release", time.Since(released))
		b.Release(ctx, o.res.Lease)
	case <-time.After(5 * time.Second):
		t.Fatal("the Wait was not woken by the release within 5s")
	}
}

// testWakePassedOn: a release of a queue's place wakes one waiter of the queue; when that
// waiter cannot take it (its tenant's cap is full), the next waiter of the queue is woken and
// takes it, at once, not after a re-check (a minute here).
func testWakePassedOn(t *testing.T, pair pairFunc) {
	a, b := pair(t, WithRecheck(time.Minute))
	ctx := context.Background()
	queue := func(tenant string) []Cap {
		return []Cap{{Key: "{p}:q", Limit: 2}, {Key: "{p}:t:" + tenant, Limit: 1}}
	}
	full := ok(t)(a.Acquire(ctx, queue("a"), time.Minute))  // tenant a is full
	other := ok(t)(a.Acquire(ctx, queue("c"), time.Minute)) // the queue is full
	type out struct {
		res Result
		err error
	}
	first, second := make(chan out, 1), make(chan out, 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { res, err := b.Wait(wctx, queue("a"), time.Minute); first <- out{res, err} }()
	testenv.WaitFor(t, 5*time.Second, "the first Wait to block", func() bool { return waiting(b) == 2 })
	go func() { res, err := b.Wait(wctx, queue("b"), time.Minute); second <- out{res, err} }()
	testenv.WaitFor(t, 5*time.Second, "the second Wait to block", func() bool { return waiting(b) == 3 })
	if err := a.Release(ctx, other.Lease); err != nil { // a place of the queue frees
		t.Fatal(err)
	}
	select {
	case o := <-second:
		if o.err != nil || !o.res.Acquired {
			t.Fatalf("second Wait: %+v, %v", o.res, o.err)
		}
		b.Release(ctx, o.res.Lease)
	case o := <-first:
		t.Fatalf("the first Wait, whose tenant is full, returned: %+v, %v", o.res, o.err)
	case <-time.After(5 * time.Second):
		t.Fatal("the second Wait was not woken within 5s: the first one kept the wake")
	}
	cancel()
	<-first
	a.Release(ctx, full.Lease)
}

// waiting returns the number of keys with waiters in s.
func waiting(s Store) int {
	var ws *waiters
	switch s := s.(type) {
	case *Memory:
		ws = &s.waiters
	case *Redis:
		ws = &s.waiters
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return len(ws.byKey)
}

// testWaitCanceled: a Wait ends with ctx.Err() when its context ends, and leaves
// nothing behind.
func testWaitCanceled(t *testing.T, pair pairFunc) {
	s, _ := pair(t)
	caps := []Cap{{Key: "{x}:k", Limit: 1}}
	held := ok(t)(s.Acquire(context.Background(), caps, time.Minute))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.Wait(ctx, caps, time.Minute)
		done <- err
	}()
	testenv.WaitFor(t, 5*time.Second, "the Wait to block", func() bool { return waiting(s) == 1 })
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait after cancel: %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return after its context was canceled")
	}
	if n := waiting(s); n != 0 {
		t.Fatalf("%d keys still have waiters", n)
	}
	// A Wait whose deadline passes returns DeadlineExceeded.
	tctx, tcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer tcancel()
	if _, err := s.Wait(tctx, caps, time.Minute); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past its deadline: %v", err)
	}
	if n := inFlight(t, s, "{x}:k"); n[0] != 1 {
		t.Fatalf("in flight %v: a canceled Wait took a place", n)
	}
	s.Release(context.Background(), held.Lease)
}

// testReleaseIsIdempotent: releasing an expired lease, a released one, or one the
// store never gave out frees nothing, and in particular not the place another lease took since.
func testReleaseIsIdempotent(t *testing.T, pair pairFunc) {
	s, _ := pair(t)
	ctx := context.Background()
	caps := []Cap{{Key: "{r}:k", Limit: 1}}
	old := ok(t)(s.Acquire(ctx, caps, 100*time.Millisecond))
	var next Result
	testenv.WaitFor(t, 5*time.Second, "the place to expire", func() bool {
		next = ok(t)(s.Acquire(ctx, caps, time.Minute))
		return next.Acquired
	})
	for _, l := range []Lease{old.Lease, old.Lease, {}, {ID: "never", Keys: []string{"{r}:k"}}} {
		if err := s.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		if n := inFlight(t, s, "{r}:k"); n[0] != 1 {
			t.Fatalf("releasing %+v freed another lease's place: in flight %v", l, n)
		}
	}
	if r := ok(t)(s.Acquire(ctx, caps, time.Minute)); r.Acquired {
		t.Fatal("a second place taken under a cap of 1 after stale releases")
	}
	for range 2 {
		if err := s.Release(ctx, next.Lease); err != nil {
			t.Fatal(err)
		}
	}
	if n := inFlight(t, s, "{r}:k"); n[0] != 0 {
		t.Fatalf("in flight %v after the release", n)
	}
}

// testInvalid: bad input is an error naming the problem, and takes nothing.
func testInvalid(t *testing.T, pair pairFunc) {
	s, _ := pair(t)
	ctx := context.Background()
	for _, tt := range []struct {
		caps []Cap
		hold time.Duration
		want error
	}{
		{nil, time.Second, ErrNoCaps},
		{[]Cap{{Key: "", Limit: 1}}, time.Second, ErrEmptyKey},
		{[]Cap{{Key: "{v}a", Limit: 0}}, time.Second, ErrInvalidLimit},
		{[]Cap{{Key: "{v}a", Limit: 1}}, 0, ErrInvalidHold},
		{[]Cap{{Key: "{v}a", Limit: 1}, {Key: "{v}a", Limit: 2}}, time.Second, ErrDuplicateKey},
	} {
		if _, err := s.Acquire(ctx, tt.caps, tt.hold); !errors.Is(err, tt.want) {
			t.Errorf("Acquire(%v, %v): %v, want %v", tt.caps, tt.hold, err, tt.want)
		}
		if _, err := s.Wait(ctx, tt.caps, tt.hold); !errors.Is(err, tt.want) {
			t.Errorf("Wait(%v, %v): %v, want %v", tt.caps, tt.hold, err, tt.want)
		}
	}
	if n := inFlight(t, s, "{v}a"); n[0] != 0 {
		t.Fatalf("in flight %v", n)
	}
}

// testRenew: a renewed lease keeps its places past its first hold; a lease one of whose places
// expired is not renewed, and gives its other places back.
func testRenew(t *testing.T, pair pairFunc) {
	a, b := pair(t)
	ctx := context.Background()
	caps := []Cap{{Key: "{r}:q", Limit: 1}, {Key: "{r}:t", Limit: 1}}
	held := ok(t)(a.Acquire(ctx, caps, 200*time.Millisecond))
	renewed, err := a.(Renewer).Renew(ctx, held.Lease, time.Minute)
	if err != nil || !renewed {
		t.Fatalf("Renew of a live lease: %v, %v; want true", renewed, err)
	}
	// Long past the first hold, the places are still held.
	time.Sleep(300 * time.Millisecond) // the first hold must pass on the store's clock
	if r := ok(t)(b.Acquire(ctx, caps[:1], time.Minute)); r.Acquired {
		t.Fatal("a renewed place expired at its first hold")
	}
	if err := a.Release(ctx, held.Lease); err != nil {
		t.Fatal(err)
	}
	// A lease whose place of {r}:t was given back (released) is not renewed, and frees {r}:q.
	short := ok(t)(a.Acquire(ctx, caps, time.Minute))
	if err := a.Release(ctx, Lease{ID: short.Lease.ID, Keys: []string{"{r}:t"}}); err != nil {
		t.Fatal(err)
	}
	if renewed, err := a.(Renewer).Renew(ctx, short.Lease, time.Minute); err != nil || renewed {
		t.Fatalf("Renew of a lease with a lost place: %v, %v; want false", renewed, err)
	}
	if n := inFlight(t, b, "{r}:q", "{r}:t"); !equal(n, []int64{0, 0}) {
		t.Fatalf("in flight after a failed Renew: %v, want none", n)
	}
}
