package limit

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// TestRedisMatchesMemory replays the same random requests, at the same instants, against both
// stores and requires identical decisions: the Lua scripts and the Go algorithms are one
// computation. The requests mix keys, costs, changes of a key's limit, DecideAll batches,
// adjustments of admitted requests (refunds and extra charges) and a clock that sometimes
// steps back.
func TestRedisMatchesMemory(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seedFromEnv(5), 6))
	for _, a := range Algorithms {
		t.Run(string(a), func(t *testing.T) {
			clk := newClock(base)
			mem := NewMemory(MemoryConfig{Now: clk.Now})
			red := NewRedis(srv.Client, RedisConfig{Prefix: testenv.Prefix(t), Now: clk.Now})
			keys := []string{"a", "b", "c"}
			limits := map[string][2]Limit{}
			for _, k := range keys {
				limits[k] = [2]Limit{randomLimit(rng, a), randomLimit(rng, a)}
			}
			type charge struct {
				q Request
				d Decision
			}
			var pending []charge // admitted, not yet adjusted
			for i := range 400 {
				if len(pending) > 0 && rng.IntN(4) == 0 {
					// Adjust an admitted request on both stores: refunds, extra charges.
					j := rng.IntN(len(pending))
					c := pending[j]
					pending = slices.Delete(pending, j, j+1)
					used := rng.Int64N(3 * c.d.Cost)
					errm := mem.Adjust(ctx, c.q.Key, c.q.Limit, c.d, used)
					errr := red.Adjust(ctx, c.q.Key, c.q.Limit, c.d, used)
					for _, err := range []error{errm, errr} {
						if err != nil && !errors.Is(err, ErrDebtCapped) {
							t.Fatal(err)
						}
					}
					if errors.Is(errm, ErrDebtCapped) != errors.Is(errr, ErrDebtCapped) {
						t.Fatalf("adjust %+v used %d: memory %v, redis %v", c, used, errm, errr)
					}
					if os.Getenv("LIMIT_DEBUG") != "" {
						t.Logf("adjust %s %+v at %v used %d", c.q.Key, c.d, clk.Now().Sub(base), used)
					}
				}
				l0 := limits["a"][0]
				gap := randomGap(rng, l0.Period)
				if rng.IntN(20) == 0 {
					clk.Add(-gap / 2)
				} else {
					clk.Add(gap)
				}
				reqs := make([]Request, 1+rng.IntN(3))
				for j := range reqs {
					k := keys[rng.IntN(len(keys))]
					l := limits[k][0]
					if rng.IntN(10) == 0 {
						l = limits[k][1]
					}
					reqs[j] = Request{Key: k, Limit: l, Cost: 1 + rng.Int64N(l.Capacity())}
				}
				var want, got []Decision
				var err error
				if len(reqs) == 1 {
					var dm, dr Decision
					if dm, err = mem.Decide(ctx, reqs[0].Key, reqs[0].Limit, reqs[0].Cost); err != nil {
						t.Fatal(err)
					}
					if dr, err = red.Decide(ctx, reqs[0].Key, reqs[0].Limit, reqs[0].Cost); err != nil {
						t.Fatal(err)
					}
					want, got = []Decision{dm}, []Decision{dr}
				} else {
					if want, err = mem.DecideAll(ctx, reqs); err != nil {
						t.Fatal(err)
					}
					if got, err = red.DecideAll(ctx, reqs); err != nil {
						t.Fatal(err)
					}
				}
				for j := range reqs {
					if got[j] != want[j] {
						t.Fatalf("request %d.%d %+v at %v: redis %s, memory %s",
							i, j, reqs[j], clk.Now().Sub(base), show(got[j]), show(want[j]))
					}
					if got[j].Allowed {
						pending = append(pending, charge{reqs[j], got[j]})
					}
				}
			}
		})
	}
}

func TestRedisKeysHaveTTLsAndHashTags(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	prefix := testenv.Prefix(t)
	r := NewRedis(srv.Client, RedisConfig{Prefix: prefix})
	for _, a := range Algorithms {
		l := Limit{Algorithm: a, Limit: 10, Period: time.Minute}
		if _, err := r.Decide(ctx, "rule:user-42", l, 1); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := srv.Client.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	// Besides the state, one epoch key per store on a single Redis, which never expires.
	keys = slices.DeleteFunc(keys, func(k string) bool { return k == prefix+"epoch" })
	if len(keys) != len(Algorithms) {
		t.Fatalf("keys %q, want one per algorithm and the epoch", keys)
	}
	tagged := regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `\{[a-z]+:rule:user-42\}$`)
	for _, k := range keys {
		if !tagged.MatchString(k) {
			t.Errorf("key %q is not prefix{algorithm:key}", k)
		}
		ttl, err := srv.Client.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		// The longest ResetAfter of one request of 10 per minute is the sliding window's:
		// the rest of this minute and most of the next.
		if ttl <= 0 || ttl > 2*time.Minute {
			t.Errorf("key %q has TTL %v, want in (0, 2m]", k, ttl)
		}
	}
}

// TestRedisServerTime decides on the server's clock (no Now override): a fixed window of one per
// hour admits once and then reports the end of the hour the server is in.
func TestRedisServerTime(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	r := NewRedis(srv.Client, RedisConfig{Prefix: testenv.Prefix(t)})
	l := Limit{Algorithm: FixedWindow, Limit: 1, Period: time.Hour}
	if d, err := r.Decide(ctx, "k", l, 1); err != nil || !d.Allowed {
		t.Fatalf("first request: %s, %v", show(d), err)
	}
	before, err := srv.Client.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	d, err := r.Decide(ctx, "k", l, 1)
	if err != nil || d.Allowed {
		t.Fatalf("second request: %s, %v", show(d), err)
	}
	toHour := before.Truncate(time.Hour).Add(time.Hour).Sub(before)
	if d.RetryAfter <= 0 || d.RetryAfter > toHour {
		t.Fatalf("RetryAfter %v, want in (0, %v], the rest of the server's hour", d.RetryAfter, toHour)
	}
}

// TestRedisScriptFlush checks that decisions survive a server that lost its script cache
// (restart, failover, SCRIPT FLUSH), in Decide and in DecideAll, and that the retry does not
// charge twice.
func TestRedisScriptFlush(t *testing.T) {
	srv := testenv.Redis(t)
	t.Run("batched", func(t *testing.T) { testScriptFlush(t, srv, 0) })
	t.Run("unbatched", func(t *testing.T) { testScriptFlush(t, srv, -1) })
}

func testScriptFlush(t *testing.T, srv *testenv.RedisServer, maxBatch int) {
	ctx := context.Background()
	clk := newClock(base)
	r := NewRedis(srv.Client, RedisConfig{Prefix: testenv.Prefix(t), Now: clk.Now, MaxBatch: maxBatch})
	l := Limit{Algorithm: FixedWindow, Limit: 3, Period: time.Hour}
	flush := func() {
		t.Helper()
		if err := srv.Client.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}

	flush()
	d, err := r.Decide(ctx, "k", l, 1)
	if err != nil || !d.Allowed || d.Remaining != 2 {
		t.Fatalf("Decide after SCRIPT FLUSH: %s, %v; want admitted with 2 remaining", show(d), err)
	}
	flush()
	other := Limit{Algorithm: SlidingLog, Limit: 3, Period: time.Hour}
	ds, err := r.DecideAll(ctx, []Request{{"k", l, 1}, {"k", other, 2}, {"k", l, 1}})
	if err != nil {
		t.Fatalf("DecideAll after SCRIPT FLUSH: %v", err)
	}
	if ds[0].Remaining != 1 || ds[1].Remaining != 1 || ds[2].Remaining != 0 || !ds[2].Allowed {
		t.Fatalf("DecideAll after SCRIPT FLUSH: %s %s %s; want remaining 1, 1, 0", show(ds[0]), show(ds[1]), show(ds[2]))
	}
	if d, _ := r.Decide(ctx, "k", l, 1); d.Allowed {
		t.Fatal("a fourth request was admitted: the retry charged twice or not at all")
	}
}

// TestRedisUnavailable checks that a store that cannot reach Redis returns an error, not a
// decision.
func TestRedisUnavailable(t *testing.T) {
	srv := testenv.Redis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rdb := srv.NewClient()
	srv.Stop()
	l := Limit{Algorithm: TokenBucket, Limit: 1, Period: time.Second}
	for _, maxBatch := range []int{0, -1} {
		r := NewRedis(rdb, RedisConfig{Prefix: testenv.Prefix(t), MaxBatch: maxBatch})
		if d, err := r.Decide(ctx, "k", l, 1); err == nil {
			t.Fatalf("MaxBatch %d: Decide with Redis down: %s, nil error", maxBatch, show(d))
		}
		if ds, err := r.DecideAll(ctx, []Request{{"k", l, 1}}); err == nil {
			t.Fatalf("MaxBatch %d: DecideAll with Redis down: %v, nil error", maxBatch, ds)
		}
	}
}

// TestRedisForeignValues checks that a key holding something the scripts did not write is
// treated as no state when it is a string (say, from an older version), and is an error, not a
// decision, when it is another type.
func TestRedisForeignValues(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	prefix := testenv.Prefix(t)
	r := NewRedis(srv.Client, RedisConfig{Prefix: prefix})
	l := Limit{Algorithm: TokenBucket, Limit: 2, Period: time.Hour}
	for _, v := range []string{"", "garbage", "12 34 56", strings.Repeat("\xff", 10_000)} {
		if err := srv.Client.Set(ctx, prefix+"{tb:k}", v, 0).Err(); err != nil {
			t.Fatal(err)
		}
		d, err := r.Decide(ctx, "k", l, 2)
		if err != nil || !d.Allowed || d.Remaining != 0 {
			t.Errorf("value %.20q: %s, %v; want a full bucket of 2 admitting 2", v, show(d), err)
		}
	}
	if err := srv.Client.Del(ctx, prefix+"{tb:k}").Err(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Client.RPush(ctx, prefix+"{tb:k}", "x").Err(); err != nil {
		t.Fatal(err)
	}
	if d, err := r.Decide(ctx, "k", l, 1); err == nil {
		t.Errorf("a list at the key: %s, nil error", show(d))
	}
}

// roundTrips records the scripts a go-redis client sends, as single commands and in pipelines
// (not the commands that set up a new connection).
type roundTrips struct {
	mu        sync.Mutex
	commands  []string // names of single commands
	pipelines [][]string
}

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.HasPrefix(cmd.Name(), "eval") {
			h.mu.Lock()
			h.commands = append(h.commands, cmd.Name())
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var names []string
		for _, c := range cmds {
			if strings.HasPrefix(c.Name(), "eval") {
				names = append(names, c.Name())
			}
		}
		if len(names) > 0 {
			h.mu.Lock()
			h.pipelines = append(h.pipelines, names)
			h.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

func (h *roundTrips) take() (commands []string, pipelines [][]string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	commands, pipelines = h.commands, h.pipelines
	h.commands, h.pipelines = nil, nil
	return commands, pipelines
}

// TestRedisRoundTrips checks that, once the server knows the scripts, a lone Decide is one
// round trip carrying one script and DecideAll (on a single Redis) one round trip carrying
// one script run of all its requests; and that a server that forgot them costs one more.
// Without coalescing Decide is a plain EVALSHA; with it, a pipeline of one (the same single
// write and read).
func TestRedisRoundTrips(t *testing.T) {
	srv := testenv.Redis(t)
	for _, tt := range []struct {
		name        string
		maxBatch    int
		cmds, pipes int // what a lone Decide sends
	}{
		{"batched", 0, 0, 1},
		{"unbatched", -1, 1, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			rdb := srv.NewClient()
			hook := &roundTrips{}
			rdb.AddHook(hook)
			r := NewRedis(rdb, RedisConfig{Prefix: testenv.Prefix(t), MaxBatch: tt.maxBatch})
			reqs := make([]Request, len(Algorithms))
			for i, a := range Algorithms {
				reqs[i] = Request{Key: "k", Limit: Limit{Algorithm: a, Limit: 5, Period: time.Minute}, Cost: 1}
				if _, err := r.Decide(ctx, "warm", reqs[i].Limit, 1); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := r.DecideAll(ctx, reqs[:2]); err != nil {
				t.Fatal(err)
			}
			hook.take()

			if _, err := r.Decide(ctx, "k", reqs[0].Limit, 1); err != nil {
				t.Fatal(err)
			}
			cmds, pipes := hook.take()
			if len(cmds) != tt.cmds || len(pipes) != tt.pipes || len(cmds)+len(pipes) != 1 ||
				(len(cmds) == 1 && cmds[0] != "evalsha") || (len(pipes) == 1 && (len(pipes[0]) != 1 || pipes[0][0] != "evalsha")) {
				t.Errorf("Decide sent commands %v and pipelines %v, want %d evalsha and %d pipeline of one evalsha",
					cmds, pipes, tt.cmds, tt.pipes)
			}
			if _, err := r.DecideAll(ctx, reqs); err != nil {
				t.Fatal(err)
			}
			if cmds, pipes := hook.take(); len(cmds) != 0 || len(pipes) != 1 || len(pipes[0]) != 1 || pipes[0][0] != "evalsha" {
				t.Errorf("DecideAll sent commands %v and pipelines %v, want one pipeline of one evalsha", cmds, pipes)
			}

			if err := rdb.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			hook.take()
			if _, err := r.DecideAll(ctx, reqs); err != nil {
				t.Fatal(err)
			}
			if cmds, pipes := hook.take(); len(cmds) != 0 || len(pipes) != 2 || pipes[1][0] != "eval" {
				t.Errorf("DecideAll after SCRIPT FLUSH sent commands %v and pipelines %v, want an evalsha pipeline and an eval one", cmds, pipes)
			}
		})
	}
}

// TestRedisDebtKeepsKeys checks, on the server's clock, that an extra charge extends a bucket
// key's TTL to when its debt is paid, and that a refund to a key that has expired does nothing
// (nor creates the key).
func TestRedisDebtKeepsKeys(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	prefix := testenv.Prefix(t)
	r := NewRedis(srv.Client, RedisConfig{Prefix: prefix})
	for _, a := range []Algorithm{TokenBucket, LeakyBucket, GCRA} {
		l := Limit{Algorithm: a, Limit: 10, Period: 10 * time.Second, Burst: 10}
		d, err := r.Decide(ctx, "k", l, 10)
		if err != nil || !d.Allowed {
			t.Fatalf("%s: %s, %v", a, show(d), err)
		}
		if err := r.Adjust(ctx, "k", l, d, 20); err != nil {
			t.Fatal(err)
		}
		key := prefix + "{" + keyTags[l.Algorithm.mustIndex()] + ":k}"
		// Empty, the bucket is whole again in 10s; 10 in debt, in 20s.
		if ttl := srv.Client.PTTL(ctx, key).Val(); ttl <= 19*time.Second || ttl > 20*time.Second {
			t.Errorf("%s: TTL %v after 10 of debt, want in (19s, 20s]", a, ttl)
		}
		if err := srv.Client.Del(ctx, key).Err(); err != nil {
			t.Fatal(err)
		}
		if err := r.Adjust(ctx, "k", l, d, 0); err != nil {
			t.Fatal(err)
		}
		if n := srv.Client.Exists(ctx, key).Val(); n != 0 {
			t.Errorf("%s: a refund to an expired key created it", a)
		}
	}
}
