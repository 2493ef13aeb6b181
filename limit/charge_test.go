package limit

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// chargeLimit is the limit of the charge-once tests for algorithm a: a capacity of 1000 that
// hardly refills over the test, so that a charge made twice shows in what is left.
func chargeLimit(a Algorithm) Limit {
	l := Limit{Algorithm: a, Limit: 1000, Period: 1000 * time.Hour, Burst: 1000}
	if a == SlidingLog {
		l.Limit = 200 // the log holds an entry per unit
	}
	return l
}

// TestChargeOnce (issue 39): in both stores (Redis: one server and a cluster) and for every
// algorithm, an extra charge made twice
// with one ChargeID is made once, the second call answering ErrChargeMade; made twice without
// one it is made twice, as before. Three keys, charged 10 and reconciled at 60: "once" twice
// with an ID, "single" once, "twice" twice without an ID; then each is asked for what is left
// (a decision of 1 at the same instant): "once" must equal "single", and "twice" must not.
func TestChargeOnce(t *testing.T) {
	srv := testenv.Redis(t)
	cluster := testenv.RedisCluster(t) // the marks are in the state's hash slot
	stores := map[string]func(now func() time.Time) Limiter{
		"redis-cluster": func(now func() time.Time) Limiter {
			return NewRedis(cluster.Client, RedisConfig{Prefix: testenv.Prefix(t), Now: now})
		},
		"memory": func(now func() time.Time) Limiter { return NewMemory(MemoryConfig{Now: now}) },
		"redis": func(now func() time.Time) Limiter {
			return NewRedis(srv.Client, RedisConfig{Prefix: testenv.Prefix(t), Now: now})
		},
		"redis-unbatched": func(now func() time.Time) Limiter {
			return NewRedis(srv.Client, RedisConfig{Prefix: testenv.Prefix(t) + "u:", Now: now, MaxBatch: -1})
		},
	}
	ctx := context.Background()
	for name, newStore := range stores {
		for _, a := range Algorithms {
			t.Run(name+"/"+string(a), func(t *testing.T) {
				clk := newClock(base)
				s := newStore(clk.Now)
				l := chargeLimit(a)
				left := map[string]Decision{}
				for i, key := range []string{"once", "single", "twice"} {
					d, err := s.Decide(ctx, string(a)+":"+key, l, 10)
					if err != nil || !d.Allowed {
						t.Fatalf("%s: decide: %s, %v", key, show(d), err)
					}
					if key == "once" {
						d.ChargeID = uint64(0x5eed0000 + i)
					}
					times := 2
					if key == "single" {
						times = 1
					}
					for n := range times {
						clk.Add(time.Millisecond)
						err := s.Adjust(ctx, string(a)+":"+key, l, d, 60)
						if key == "once" && n == 1 {
							if !errors.Is(err, ErrChargeMade) {
								t.Fatalf("%s: the same charge made again: %v, want ErrChargeMade", key, err)
							}
						} else if err != nil {
							t.Fatalf("%s: adjust %d: %v", key, n+1, err)
						}
					}
				}
				for _, key := range []string{"once", "single", "twice"} {
					d, err := s.Decide(ctx, string(a)+":"+key, l, 1)
					if err != nil {
						t.Fatal(err)
					}
					left[key] = Decision{Allowed: d.Allowed, Remaining: d.Remaining}
				}
				t.Logf("left after the charges: once %+v, single %+v, twice %+v", left["once"], left["single"], left["twice"])
				if left["once"] != left["single"] {
					t.Errorf("a charge made twice with one ID left %+v, one made once %+v", left["once"], left["single"])
				}
				if left["twice"] == left["single"] {
					t.Errorf("a charge made twice without an ID left what one made once does (%+v): the test cannot tell", left["single"])
				}
			})
		}
	}
}

// TestRedisChargeOnceAfterStall (issue 39): an extra charge whose call reached a stopped
// redis-server (SIGSTOP) times out, and runs when the server resumes (SIGCONT). Made again
// with its ChargeID, as the ingress makes an owed charge, it changes nothing: the key is
// charged 500 once. Before, it was charged twice (the second decision below was refused).
func TestRedisChargeOnceAfterStall(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	for _, a := range []Algorithm{TokenBucket, SlidingWindow} {
		t.Run(string(a), func(t *testing.T) {
			s := NewRedis(rdb, RedisConfig{Prefix: testenv.Prefix(t)})
			l := Limit{Algorithm: a, Limit: 1000, Period: 1000 * time.Hour}
			d, err := s.Decide(ctx, "k", l, 100)
			if err != nil || !d.Allowed {
				t.Fatalf("decide: %s, %v", show(d), err)
			}
			// The server knows the adjustment script (a stalled EVALSHA of one it did not
			// know would answer NOSCRIPT on SIGCONT, and charge nothing).
			warm, _ := s.Decide(ctx, "warm", l, 1)
			if err := s.Adjust(ctx, "warm", l, warm, 2); err != nil {
				t.Fatal(err)
			}
			calls := evalshaCalls(t, srv.Client)
			d.ChargeID = 42
			srv.Pause()
			actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			err = s.Adjust(actx, "k", l, d, 600)
			cancel()
			srv.Resume()
			if err == nil {
				t.Fatal("an Adjust to a stopped server succeeded")
			}
			testenv.WaitFor(t, 5*time.Second, "the stalled EVALSHA to run", func() bool {
				return evalshaCalls(t, srv.Client) > calls
			})
			err = s.Adjust(ctx, "k", l, d, 600) // made again, as an owed charge is
			if !errors.Is(err, ErrChargeMade) {
				t.Errorf("the charge made again after the stall: %v, want ErrChargeMade (the first call ran on SIGCONT)", err)
			}
			// 1000 - 100 - 500 = 400 left (1000 - 100 - 2 × 500 = -100 had it been made twice).
			got, err := s.Decide(ctx, "k", l, 400)
			if err != nil {
				t.Fatal(err)
			}
			if !got.Allowed {
				t.Errorf("a decision of 400 after the charge: %s, want admitted (the extra 500 charged once)", show(got))
			}
		})
	}
}

// TestChargeMarksBounded: the Memory store's record of charge IDs keeps each for
// ChargeMarkTTL, at most memoryChargeMarks, and the latest of them.
func TestChargeMarksBounded(t *testing.T) {
	var c chargeMarks
	ttl := ChargeMarkTTL.Microseconds()
	if !c.once(1, 1) || c.once(1, ttl) {
		t.Fatal("an ID recorded at 1 was not seen again before ChargeMarkTTL")
	}
	if !c.once(1, ttl+1) {
		t.Fatal("an ID recorded at 1 was still seen at ChargeMarkTTL")
	}
	const n = 4 * memoryChargeMarks
	for id := uint64(2); id < n; id++ {
		c.once(id*0x9e3779b97f4a7c15, ttl+1+int64(id)) // spread as random IDs are
	}
	held := 0
	for i := range c.shards {
		for _, b := range c.shards[i].b {
			for _, e := range b.exp {
				if e != 0 {
					held++
				}
			}
		}
	}
	if held > memoryChargeMarks {
		t.Fatalf("%d IDs recorded, want at most %d", held, memoryChargeMarks)
	}
	forgotten := 0
	for id := uint64(n - 1000); id < n; id++ {
		if c.once(id*0x9e3779b97f4a7c15, ttl+1+int64(n)) {
			forgotten++
		}
	}
	t.Logf("%d IDs held of %d recorded; %d of the latest 1000 forgotten", held, n, forgotten)
	if forgotten > 0 {
		t.Errorf("%d of the latest 1000 IDs forgotten", forgotten)
	}
}

// evalshaCalls is how many EVALSHA calls the server has run (INFO commandstats).
func evalshaCalls(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(info, "cmdstat_evalsha:calls=")
	if !ok {
		return 0
	}
	n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
	return n
}
