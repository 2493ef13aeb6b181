package limit

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// base is the instant the step tables count from: 1:00:00, a whole minute (and hour) since the
// Unix epoch, so that windows start on it.
var base = time.Date(2026, 11, 21, 1, 0, 0, 0, time.UTC)

// clock is a settable clock for tests.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock(t time.Time) *clock { return &clock{t: t} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// step is one request of a step table: at base+at, key (default "k") with cost (default 1),
// under the case's limit unless limit is set. want.Limit is filled in from the limit.
type step struct {
	at    time.Duration
	key   string
	cost  int64
	limit *Limit
	want  Decision
}

func ok(remaining int64, reset time.Duration) Decision {
	return Decision{Allowed: true, Remaining: remaining, ResetAfter: reset}
}

func no(remaining int64, reset, retry time.Duration) Decision {
	return Decision{Remaining: remaining, ResetAfter: reset, RetryAfter: retry}
}

const µs = time.Microsecond

// conformanceCases are the step tables every store must pass. The values were worked out by
// hand from the algorithms' definitions, not taken from the code.
var conformanceCases = []struct {
	name  string
	limit Limit
	steps []step
}{
	{
		name:  "token_bucket/design: 4 tokens refilled 4 per minute",
		limit: Limit{Algorithm: TokenBucket, Limit: 4, Period: time.Minute},
		steps: []step{
			{at: 0, want: ok(3, 15*time.Second)},
			{at: 0, want: ok(2, 30*time.Second)},
			{at: 0, want: ok(1, 45*time.Second)},
			{at: 0, want: ok(0, 60*time.Second)},
			{at: 0, want: no(0, 60*time.Second, 15*time.Second)},
			{at: 15 * time.Second, want: ok(0, 60*time.Second)},
			{at: 20 * time.Second, want: no(0, 55*time.Second, 10*time.Second)},
			{at: 30 * time.Second, want: ok(0, 60*time.Second)},
			{at: 90 * time.Second, cost: 2, want: ok(2, 30*time.Second)}, // full again, then 2 taken
			{at: 90 * time.Second, cost: 3, want: no(2, 30*time.Second, 15*time.Second)},
		},
	},
	{
		name:  "token_bucket/burst above the rate",
		limit: Limit{Algorithm: TokenBucket, Limit: 1, Period: time.Second, Burst: 3},
		steps: []step{
			{at: 0, want: ok(2, time.Second)},
			{at: 0, want: ok(1, 2*time.Second)},
			{at: 0, want: ok(0, 3*time.Second)},
			{at: 0, want: no(0, 3*time.Second, time.Second)},
			{at: 2500 * time.Millisecond, want: ok(1, 1500*time.Millisecond)}, // 2.5 tokens, 1 taken
		},
	},
	{
		name:  "token_bucket/a third of a second per token, exactly",
		limit: Limit{Algorithm: TokenBucket, Limit: 3, Period: time.Second},
		steps: []step{
			{at: 0, want: ok(2, 333334*µs)},
			{at: 0, want: ok(1, 666667*µs)},
			{at: 0, want: ok(0, time.Second)},
			{at: 0, want: no(0, time.Second, 333334*µs)},
			{at: 333333 * µs, want: no(0, 666667*µs, 1*µs)},
			{at: time.Second, want: ok(2, 333334*µs)}, // exactly full after 1s: no drift
		},
	},
	{
		name:  "token_bucket/a changed limit keeps the tokens",
		limit: Limit{Algorithm: TokenBucket, Limit: 10, Period: time.Second},
		steps: []step{
			{at: 0, cost: 5, want: ok(5, 500*time.Millisecond)},
			{at: 0, limit: &Limit{Algorithm: TokenBucket, Limit: 20, Period: time.Second}, want: ok(4, 800*time.Millisecond)},
		},
	},
	{
		name:  "leaky_bucket/capacity 1 spaces requests 1/rate apart",
		limit: Limit{Algorithm: LeakyBucket, Limit: 2, Period: time.Second},
		steps: []step{
			{at: 0, want: ok(0, 500*time.Millisecond)},
			{at: 400 * time.Millisecond, want: no(0, 100*time.Millisecond, 100*time.Millisecond)},
			{at: 500 * time.Millisecond, want: ok(0, 500*time.Millisecond)},
			{at: 2 * time.Second, want: ok(0, 500*time.Millisecond)},
		},
	},
	{
		name:  "leaky_bucket/burst",
		limit: Limit{Algorithm: LeakyBucket, Limit: 1, Period: time.Second, Burst: 3},
		steps: []step{
			{at: 0, want: ok(2, time.Second)},
			{at: 0, want: ok(1, 2*time.Second)},
			{at: 0, want: ok(0, 3*time.Second)},
			{at: 0, want: no(0, 3*time.Second, time.Second)},
			{at: 1500 * time.Millisecond, want: ok(0, 2500*time.Millisecond)}, // 1.5 left, +1
		},
	},
	{
		name:  "gcra/burst 2 at 10 per second",
		limit: Limit{Algorithm: GCRA, Limit: 10, Period: time.Second, Burst: 2},
		steps: []step{
			{at: 0, want: ok(1, 100*time.Millisecond)},
			{at: 0, want: ok(0, 200*time.Millisecond)},
			{at: 0, want: no(0, 200*time.Millisecond, 100*time.Millisecond)},
			{at: 100 * time.Millisecond, want: ok(0, 200*time.Millisecond)},
			{at: 150 * time.Millisecond, want: no(0, 150*time.Millisecond, 50*time.Millisecond)},
			{at: 500 * time.Millisecond, cost: 2, want: ok(0, 200*time.Millisecond)},
		},
	},
	{
		name:  "gcra/an emission interval of 333333.3µs does not drift",
		limit: Limit{Algorithm: GCRA, Limit: 3, Period: time.Second},
		steps: []step{
			{at: 0, want: ok(2, 333334*µs)},
			{at: 0, want: ok(1, 666667*µs)},
			{at: 0, want: ok(0, time.Second)},
			{at: 0, want: no(0, time.Second, 333334*µs)},
			{at: time.Second, want: ok(2, 333334*µs)},
		},
	},
	{
		name:  "fixed_window/design: 3 per second, twice that around a boundary",
		limit: Limit{Algorithm: FixedWindow, Limit: 3, Period: time.Second},
		steps: []step{
			{at: 500 * time.Millisecond, want: ok(2, 500*time.Millisecond)},
			{at: 800 * time.Millisecond, want: ok(1, 200*time.Millisecond)},
			{at: 900 * time.Millisecond, want: ok(0, 100*time.Millisecond)},
			{at: 950 * time.Millisecond, want: no(0, 50*time.Millisecond, 50*time.Millisecond)},
			{at: time.Second, want: ok(2, time.Second)},
			{at: time.Second, want: ok(1, time.Second)},
			{at: 1050 * time.Millisecond, want: ok(0, 950*time.Millisecond)}, // 6 within 250ms
			{at: 1100 * time.Millisecond, want: no(0, 900*time.Millisecond, 900*time.Millisecond)},
		},
	},
	{
		name:  "fixed_window/cost",
		limit: Limit{Algorithm: FixedWindow, Limit: 5, Period: time.Minute},
		steps: []step{
			{at: 10 * time.Second, cost: 3, want: ok(2, 50*time.Second)},
			{at: 20 * time.Second, cost: 3, want: no(2, 40*time.Second, 40*time.Second)},
			{at: 20 * time.Second, cost: 2, want: ok(0, 40*time.Second)},
			{at: 60 * time.Second, cost: 5, want: ok(0, 60*time.Second)},
		},
	},
	{
		name:  "sliding_log/design: 2 per minute",
		limit: Limit{Algorithm: SlidingLog, Limit: 2, Period: time.Minute},
		steps: []step{
			{at: 1 * time.Second, want: ok(1, 60*time.Second)},                  // 1:00:01
			{at: 30 * time.Second, want: ok(0, 60*time.Second)},                 // 1:00:30
			{at: 50 * time.Second, want: no(0, 40*time.Second, 11*time.Second)}, // 1:00:50
			{at: 100 * time.Second, want: ok(1, 60*time.Second)},                // 1:01:40
		},
	},
	{
		name:  "sliding_log/an entry leaves exactly one period after it came",
		limit: Limit{Algorithm: SlidingLog, Limit: 2, Period: time.Minute},
		steps: []step{
			{at: 1 * time.Second, want: ok(1, 60*time.Second)},
			{at: 30 * time.Second, want: ok(0, 60*time.Second)},
			{at: 61*time.Second - µs, want: no(0, 29*time.Second+µs, µs)},
			{at: 61 * time.Second, want: ok(0, 60*time.Second)},
			{at: 61 * time.Second, cost: 2, want: no(0, 60*time.Second, 60*time.Second)},
		},
	},
	{
		name:  "sliding_window/design: 7 per minute, 5 before and 3 now, at 30%",
		limit: Limit{Algorithm: SlidingWindow, Limit: 7, Period: time.Minute},
		steps: []step{
			// The previous minute, 1:00: five requests. The estimate falls to 0 one minute
			// after the window ends, less the share that rounds down: with c requests,
			// floor(c × left/60s) is 0 once left < 60s/c.
			{at: 10 * time.Second, want: ok(6, 50*time.Second+µs)},
			{at: 10 * time.Second, want: ok(5, 80*time.Second+µs)},
			{at: 10 * time.Second, want: ok(4, 90*time.Second+µs)},
			{at: 10 * time.Second, want: ok(3, 95*time.Second+µs)},
			{at: 10 * time.Second, want: ok(2, 98*time.Second+µs)},
			// This minute, 1:01: three requests; 5 × 55/60 = 4.58 → 4 from before.
			{at: 65 * time.Second, want: ok(2, 55*time.Second+µs)},
			{at: 65 * time.Second, want: ok(1, 85*time.Second+µs)},
			{at: 65 * time.Second, want: ok(0, 95*time.Second+µs)},
			// 30% into the minute: floor(5 × 0.7) + 3 = 6, so one more fits, then none.
			{at: 78 * time.Second, want: ok(0, 87*time.Second+µs)},
			{at: 78 * time.Second, want: no(0, 87*time.Second+µs, 6*time.Second+µs)},
			// floor(5 × 35.999999/60) + 4 = 6 just after 1:01:24.
			{at: 84*time.Second + µs, want: ok(0, 84*time.Second)},
		},
	},
	{
		name:  "sliding_window/no doubling around a boundary",
		limit: Limit{Algorithm: SlidingWindow, Limit: 3, Period: time.Second},
		steps: []step{
			{at: 900 * time.Millisecond, want: ok(2, 100*time.Millisecond+µs)},
			{at: 900 * time.Millisecond, want: ok(1, 600001*µs)},
			{at: 900 * time.Millisecond, want: ok(0, 766667*µs)},
			{at: time.Second, want: no(0, 666667*µs, µs)},
			{at: time.Second + µs, want: ok(0, time.Second)},
		},
	},
	{
		name:  "keys and algorithms do not share state",
		limit: Limit{Algorithm: FixedWindow, Limit: 1, Period: time.Hour},
		steps: []step{
			{at: 0, key: "a", want: ok(0, time.Hour)},
			{at: 0, key: "b", want: ok(0, time.Hour)},
			{at: 0, key: "a", want: no(0, time.Hour, time.Hour)},
			{at: 0, key: "a", limit: &Limit{Algorithm: SlidingLog, Limit: 1, Period: time.Hour}, want: ok(0, time.Hour)},
			{at: 0, key: "a", limit: &Limit{Algorithm: TokenBucket, Limit: 1, Period: time.Hour}, want: ok(0, time.Hour)},
		},
	},
}

// newLimiter returns a fresh, empty limiter whose clock is now.
type newLimiter func(t *testing.T, now func() time.Time) Limiter

// testConformance runs the step tables against a store, once with Decide and once with
// DecideAll (the steps of one instant in one call).
func testConformance(t *testing.T, newLimiter newLimiter) {
	ctx := context.Background()
	for _, c := range conformanceCases {
		for _, all := range []bool{false, true} {
			name := c.name
			if all {
				name += "/DecideAll"
			}
			t.Run(name, func(t *testing.T) {
				clk := newClock(base)
				l := newLimiter(t, clk.Now)
				reqs := make([]Request, len(c.steps))
				wants := make([]Decision, len(c.steps))
				for i, s := range c.steps {
					reqs[i] = Request{Key: "k", Limit: c.limit, Cost: 1}
					if s.key != "" {
						reqs[i].Key = s.key
					}
					if s.cost != 0 {
						reqs[i].Cost = s.cost
					}
					if s.limit != nil {
						reqs[i].Limit = *s.limit
					}
					wants[i] = s.want
					wants[i].Limit = reqs[i].Limit.Limit
				}
				for i := 0; i < len(c.steps); {
					clk.Set(base.Add(c.steps[i].at))
					j := i + 1
					for all && j < len(c.steps) && c.steps[j].at == c.steps[i].at {
						j++
					}
					var got []Decision
					if all {
						var err error
						if got, err = l.DecideAll(ctx, reqs[i:j]); err != nil {
							t.Fatalf("step %d: %v", i, err)
						}
					} else {
						d, err := l.Decide(ctx, reqs[i].Key, reqs[i].Limit, reqs[i].Cost)
						if err != nil {
							t.Fatalf("step %d: %v", i, err)
						}
						got = []Decision{d}
					}
					for k, d := range got {
						if d != wants[i+k] {
							t.Errorf("step %d (at +%v, key %q, cost %d):\n got %s\nwant %s",
								i+k, c.steps[i+k].at, reqs[i+k].Key, reqs[i+k].Cost, show(d), show(wants[i+k]))
						}
					}
					i = j
				}
			})
		}
	}
}

func show(d Decision) string {
	return fmt.Sprintf("{Allowed:%v Limit:%d Remaining:%d ResetAfter:%v RetryAfter:%v}",
		d.Allowed, d.Limit, d.Remaining, d.ResetAfter, d.RetryAfter)
}

func TestMemoryConformance(t *testing.T) {
	testConformance(t, func(t *testing.T, now func() time.Time) Limiter {
		return NewMemory(MemoryConfig{Now: now})
	})
}

func TestRedisConformance(t *testing.T) {
	srv := testenv.Redis(t)
	for name, maxBatch := range map[string]int{"batched": 0, "unbatched": -1} {
		t.Run(name, func(t *testing.T) {
			testConformance(t, func(t *testing.T, now func() time.Time) Limiter {
				return NewRedis(srv.Client, RedisConfig{Prefix: testenv.Prefix(t), Now: now, MaxBatch: maxBatch})
			})
		})
	}
}

// TestRedisClusterConformance runs the conformance table against a real three-node Redis
// Cluster: every key is hash-tagged, so each script touches one slot, and batched decisions
// are pipelined per node.
func TestRedisClusterConformance(t *testing.T) {
	c := testenv.RedisCluster(t)
	for name, maxBatch := range map[string]int{"batched": 0, "unbatched": -1} {
		t.Run(name, func(t *testing.T) {
			testConformance(t, func(t *testing.T, now func() time.Time) Limiter {
				return NewRedis(c.Client, RedisConfig{Prefix: testenv.Prefix(t), Now: now, MaxBatch: maxBatch})
			})
		})
	}
}
