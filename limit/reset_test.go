package limit

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// TestStoreResetHoldAndAllow restarts a real redis-server without persistence after
// every key used its limit: a key of a limit with on_store_reset hold is refused until its hold
// has passed since the store learned of the loss, then admitted; a key of an allow limit is
// admitted at once. Every algorithm; the loss is reported once per store, and a store that
// never knew the old epoch (a process started after the restart) holds the held keys too.
func TestStoreResetHoldAndAllow(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	prefix := testenv.Prefix(t)
	var losses atomic.Int32
	r := NewRedis(srv.Client, RedisConfig{Prefix: prefix, OnLoss: func(string) { losses.Add(1) }})
	limits := map[Algorithm]Limit{}
	for _, a := range Algorithms {
		l := Limit{Algorithm: a, Limit: 2, Period: 600 * time.Millisecond}
		if a == LeakyBucket {
			l.Burst = 2 // whole again after 600ms, as the others
		}
		limits[a] = l
		for _, mode := range []ResetMode{ResetConservative, ResetFresh} {
			l.OnReset = mode
			for n := 0; ; n++ {
				d, err := r.Decide(ctx, string(mode)+":"+string(a), l, 1)
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed {
					break
				}
				if n > 2 {
					t.Fatalf("%s %s: admitted %d of a limit of 2", a, mode, n+1)
				}
			}
		}
	}

	srv.Stop()
	srv.Start()
	learned := time.Now()
	for _, a := range Algorithms {
		l := limits[a]
		l.OnReset = ResetFresh
		if d, err := r.Decide(ctx, string(ResetFresh)+":"+string(a), l, 1); err != nil || !d.Allowed {
			t.Errorf("%s fresh: after the restart %+v, %v; want admitted at once", a, d, err)
		}
		l.OnReset = ResetConservative
		d, err := r.Decide(ctx, string(ResetConservative)+":"+string(a), l, 1)
		if err != nil || d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > l.Period {
			t.Errorf("%s conservative: after the restart %+v, %v; want refused for at most %v", a, d, err, l.Period)
		}
	}
	if n := losses.Load(); n != 1 {
		t.Errorf("the loss was reported %d times, want once", n)
	}
	other := NewRedis(srv.NewClient(), RedisConfig{Prefix: prefix})
	l := limits[TokenBucket]
	l.OnReset = ResetConservative
	if d, err := other.Decide(ctx, "new:"+string(TokenBucket), l, 1); err != nil || d.Allowed {
		t.Errorf("a new store's conservative key after the restart: %+v, %v; want refused", d, err)
	}

	for _, a := range Algorithms {
		l := limits[a]
		l.OnReset = ResetConservative
		deadline := time.Now().Add(3 * time.Second)
		for {
			d, err := r.Decide(ctx, string(ResetConservative)+":"+string(a), l, 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				if since := time.Since(learned); since < l.Period-5*time.Millisecond {
					t.Errorf("%s conservative: admitted %v after the loss was learned, want ≥ %v", a, since, l.Period)
				} else {
					t.Logf("%s conservative: admitted again %v after the loss was learned (hold %v)", a, since.Round(time.Millisecond), l.Period)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s conservative: still refused 3s after the restart: %+v", a, d)
			}
			time.Sleep(d.RetryAfter) // the wait the decision names
		}
	}
}

// TestResetModeValidate: an unknown on-reset mode is refused by Validate.
func TestResetModeValidate(t *testing.T) {
	l := Limit{Algorithm: TokenBucket, Limit: 1, Period: time.Second, OnReset: "sometimes"}
	if err := l.Validate(); err == nil {
		t.Fatal("Validate accepted OnReset \"sometimes\"")
	}
	for _, m := range []ResetMode{"", ResetFresh, ResetConservative} {
		l.OnReset = m
		if err := l.Validate(); err != nil {
			t.Errorf("OnReset %q: %v", m, err)
		}
	}
	if h := (Limit{Algorithm: GCRA, Limit: 10, Period: time.Second, Burst: 20, OnReset: ResetConservative}).ResetHold(); h != 2_000_000 {
		t.Errorf("the hold of a GCRA of 10/s, burst 20: %dµs, want 2s", h)
	}
}

// TestStoreResetOnCluster: on a real three-node Redis Cluster, a FLUSHALL of every master is
// learned per hash slot: two conservative keys in different slots are each refused after it,
// and the loss is reported once per slot.
func TestStoreResetOnCluster(t *testing.T) {
	c := testenv.RedisCluster(t)
	ctx := context.Background()
	var losses atomic.Int32
	r := NewRedis(c.Client, RedisConfig{Prefix: testenv.Prefix(t), OnLoss: func(string) { losses.Add(1) }})
	l := Limit{Algorithm: FixedWindow, Limit: 1, Period: time.Minute, OnReset: ResetConservative}
	keys := []string{"a", "b"}
	if hashSlot(r.key(keys[0], algFixedWindow)) == hashSlot(r.key(keys[1], algFixedWindow)) {
		t.Fatal("the two keys share a slot")
	}
	for _, k := range keys {
		if d, err := r.Decide(ctx, k, l, 1); err != nil || !d.Allowed {
			t.Fatalf("%s before the flush: %+v, %v", k, d, err)
		}
	}
	if err := c.Client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		return m.FlushAll(ctx).Err()
	}); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		d, err := r.Decide(ctx, k, l, 1)
		if err != nil || d.Allowed || d.RetryAfter <= 55*time.Second {
			t.Errorf("%s after the flush: %+v, %v; want refused for about a minute", k, d, err)
		}
	}
	if n := losses.Load(); n != 2 {
		t.Errorf("losses reported %d times, want once per slot (2)", n)
	}
}
