package limit

import (
	"context"
	"errors"
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
// under the case's limit unless limit is set. want.Limit, want.At and want.Cost are filled in
// from the limit, the instant and the cost. A step with adjust set is no request but an
// Adjust of the decision of an earlier step.
type step struct {
	at     time.Duration
	key    string
	cost   int64
	limit  *Limit
	want   Decision
	adjust *adjustment
}

// adjustment is an Adjust step: the decision of step of reconciled with a true cost of used.
type adjustment struct {
	of     int
	used   int64
	capped bool // Adjust reports ErrDebtCapped
}

// fix returns an Adjust step at at: step of's decision used used.
func fix(at time.Duration, of int, used int64) step {
	return step{at: at, adjust: &adjustment{of: of, used: used}}
}

// fixCapped is fix for an Adjust that owes more than the key may: it reports ErrDebtCapped.
func fixCapped(at time.Duration, of int, used int64) step {
	return step{at: at, adjust: &adjustment{of: of, used: used, capped: true}}
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
		name:  "token_bucket/a refund gives back what a smaller charge would have left; a charge goes into debt, paid in full",
		limit: Limit{Algorithm: TokenBucket, Limit: 10, Period: 10 * time.Second, Refunds: true},
		steps: []step{
			{at: 0, cost: 3, want: ok(7, 3*time.Second)},
			{at: 0, cost: 5, want: ok(2, 8*time.Second)},
			// 3 back: the bucket held at most 7 since the charge, so had it charged 0 it would
			// hold 3 more now (7 instead of 4), and the next request is admitted.
			fix(2*time.Second, 0, 0),
			{at: 2 * time.Second, cost: 6, want: ok(1, 9*time.Second)},
			// 25 more: -24 tokens, over two capacities of debt, paid at the rate before the next.
			fix(2*time.Second, 1, 30),
			{at: 2 * time.Second, cost: 1, want: no(0, 34*time.Second, 25*time.Second)},
			{at: 27*time.Second - µs, cost: 1, want: no(0, 9*time.Second+µs, µs)},
			{at: 27 * time.Second, cost: 1, want: ok(0, 10*time.Second)},
		},
	},
	{
		name:  "token_bucket/without Refunds a refund gives back the charge less what the rate refilled since",
		limit: Limit{Algorithm: TokenBucket, Limit: 10, Period: 10 * time.Second},
		steps: []step{
			{at: 0, cost: 3, want: ok(7, 3*time.Second)},
			{at: 0, cost: 5, want: ok(2, 8*time.Second)},
			// 3 back, 2 s later: no record of levels, so at most 3 - 2 (refilled since): 1.
			fix(2*time.Second, 0, 0),
			{at: 2 * time.Second, cost: 6, want: no(5, 5*time.Second, time.Second)},
			{at: 3 * time.Second, cost: 6, want: ok(0, 10*time.Second)},
		},
	},
	{
		name:  "token_bucket/debt is capped at DebtCapacities capacities",
		limit: Limit{Algorithm: TokenBucket, Limit: 1, Period: time.Second, Refunds: true},
		steps: []step{
			{at: 0, want: ok(0, time.Second)},
			fixCapped(0, 0, 500), // 499 more, 100 owed at most
			{at: 0, want: no(0, 101*time.Second, 101*time.Second)},
			{at: 101 * time.Second, want: ok(0, time.Second)},
		},
	},
	{
		name:  "token_bucket/a refund right away gives back all of it",
		limit: Limit{Algorithm: TokenBucket, Limit: 10, Period: 10 * time.Second, Refunds: true},
		steps: []step{
			{at: 0, cost: 8, want: ok(2, 8*time.Second)},
			fix(500*time.Millisecond, 0, 1),
			{at: 500 * time.Millisecond, cost: 9, want: ok(0, 9500*time.Millisecond)},
			fix(500*time.Millisecond, 2, 0),
			{at: 500 * time.Millisecond, cost: 10, want: no(9, 500*time.Millisecond, 500*time.Millisecond)},
		},
	},
	{
		name:  "leaky_bucket/cost, refund and a charge carried as debt",
		limit: Limit{Algorithm: LeakyBucket, Limit: 1, Period: time.Second, Burst: 5},
		steps: []step{
			{at: 0, cost: 3, want: ok(2, 3*time.Second)},
			{at: 0, cost: 3, want: no(2, 3*time.Second, time.Second)},
			fix(time.Second, 0, 1), // 2 out: the level is 0
			{at: time.Second, cost: 5, want: ok(0, 5*time.Second)},
			fix(time.Second, 3, 20), // 15 more: a level of 20, three capacities of debt
			{at: time.Second, cost: 1, want: no(0, 20*time.Second, 16*time.Second)},
			{at: 17 * time.Second, cost: 1, want: ok(0, 5*time.Second)},
		},
	},
	{
		name:  "gcra/a refund moves the TAT back by what has not been repaid; a charge beyond the tolerance",
		limit: Limit{Algorithm: GCRA, Limit: 10, Period: time.Second},
		steps: []step{
			{at: 0, cost: 4, want: ok(6, 400*time.Millisecond)},
			{at: 0, cost: 4, want: ok(2, 800*time.Millisecond)},
			{at: 0, cost: 4, want: no(2, 800*time.Millisecond, 200*time.Millisecond)},
			fix(100*time.Millisecond, 1, 1), // 3 back: 300ms
			{at: 100 * time.Millisecond, cost: 6, want: ok(0, time.Second)},
			// 4 back, but 3 have been repaid since: 100ms. The whole 400ms would admit the
			// next request; recomputing with a cost of 0 would not.
			fix(300*time.Millisecond, 0, 0),
			{at: 300 * time.Millisecond, cost: 4, want: no(3, 700*time.Millisecond, 100*time.Millisecond)},
			fix(300*time.Millisecond, 4, 16), // 10 more: a TAT 1.7s ahead
			{at: 300 * time.Millisecond, cost: 1, want: no(0, 1700*time.Millisecond, 800*time.Millisecond)},
		},
	},
	{
		name:  "gcra/debt of five capacities, paid before the next request",
		limit: Limit{Algorithm: GCRA, Limit: 10, Period: time.Second},
		steps: []step{
			{at: 0, cost: 10, want: ok(0, time.Second)},
			fix(0, 0, 60), // 50 more: a TAT 6s ahead
			{at: 0, cost: 1, want: no(0, 6*time.Second, 5100*time.Millisecond)},
			{at: 5100 * time.Millisecond, cost: 1, want: ok(0, time.Second)},
		},
	},
	{
		name:  "fixed_window/refund in the window of the charge, charge beyond the limit carried",
		limit: Limit{Algorithm: FixedWindow, Limit: 10, Period: time.Minute},
		steps: []step{
			{at: 10 * time.Second, cost: 7, want: ok(3, 50*time.Second)},
			{at: 20 * time.Second, cost: 5, want: no(3, 40*time.Second, 40*time.Second)},
			fix(30*time.Second, 0, 2),
			{at: 30 * time.Second, cost: 5, want: ok(3, 30*time.Second)},
			fix(40*time.Second, 3, 9), // 4 more: 11, one more than the window holds
			{at: 40 * time.Second, cost: 1, want: no(0, 80*time.Second, 20*time.Second)},
			{at: 60 * time.Second, cost: 10, want: no(9, 60*time.Second, 60*time.Second)}, // 1 carried
			{at: 60 * time.Second, cost: 9, want: ok(0, 60*time.Second)},
			fix(61*time.Second, 3, 0), // the charge's window has ended: nothing
			{at: 61 * time.Second, cost: 1, want: no(0, 59*time.Second, 59*time.Second)},
		},
	},
	{
		name:  "fixed_window/debt of two and a half windows, paid window after window",
		limit: Limit{Algorithm: FixedWindow, Limit: 10, Period: time.Minute},
		steps: []step{
			{at: 0, cost: 10, want: ok(0, time.Minute)},
			fix(10*time.Second, 0, 35), // 25 more: 35, counted 10 a window
			{at: 10 * time.Second, cost: 1, want: no(0, 230*time.Second, 170*time.Second)},
			{at: 120 * time.Second, cost: 1, want: no(0, 120*time.Second, 60*time.Second)}, // 15 left
			{at: 180 * time.Second, cost: 6, want: no(5, time.Minute, time.Minute)},        // 5 left
			{at: 180 * time.Second, cost: 5, want: ok(0, time.Minute)},
		},
	},
	{
		name:  "sliding_window/refund from the previous window, charge to the current one",
		limit: Limit{Algorithm: SlidingWindow, Limit: 10, Period: time.Minute},
		steps: []step{
			{at: 30 * time.Second, cost: 6, want: ok(4, 80*time.Second+µs)},
			{at: 30 * time.Second, cost: 4, want: ok(0, 84*time.Second+µs)},
			// The next minute, 50s left: floor(10 × 50/60) = 8.
			{at: 70 * time.Second, cost: 3, want: no(2, 44*time.Second+µs, 2*time.Second+µs)},
			fix(70*time.Second, 0, 1), // the previous window counts 5: floor(5 × 50/60) = 4
			{at: 70 * time.Second, cost: 3, want: ok(3, 90*time.Second+µs)},
			fix(70*time.Second, 4, 6), // 3 more now: 4 + 6
			{at: 70 * time.Second, cost: 1, want: no(0, 100*time.Second+µs, 2*time.Second+µs)},
			// Two windows on, the charge of step 1 no longer weighs: nothing to refund.
			fix(130*time.Second, 1, 0),
			{at: 130 * time.Second, cost: 6, want: no(5, 40*time.Second+µs, µs)},
		},
	},
	{
		name:  "sliding_window/debt of two windows, paid window after window",
		limit: Limit{Algorithm: SlidingWindow, Limit: 10, Period: time.Minute},
		steps: []step{
			{at: 0, cost: 10, want: ok(0, 114*time.Second+µs)},
			fix(0, 0, 30), // 20 more: 30 counted, 10 a window
			{at: 0, cost: 1, want: no(0, 234*time.Second+µs, 180*time.Second+µs)},
			{at: 120 * time.Second, cost: 1, want: no(0, 114*time.Second+µs, 60*time.Second+µs)},
			{at: 180 * time.Second, cost: 1, want: no(0, 54*time.Second+µs, µs)},
			{at: 180*time.Second + µs, cost: 1, want: ok(0, time.Minute)},
		},
	},
	{
		name:  "sliding_log/refund removes entries of the charge's instant, charge adds entries now up to the limit",
		limit: Limit{Algorithm: SlidingLog, Limit: 5, Period: time.Minute},
		steps: []step{
			{at: 0, cost: 3, want: ok(2, 60*time.Second)},
			{at: 10 * time.Second, cost: 2, want: ok(0, 60*time.Second)},
			{at: 20 * time.Second, cost: 1, want: no(0, 50*time.Second, 40*time.Second)},
			fix(20*time.Second, 0, 1), // log 0, 10, 10
			{at: 20 * time.Second, cost: 2, want: ok(0, 60*time.Second)},
			fix(30*time.Second, 1, 0),        // log 0, 20, 20
			fixCapped(30*time.Second, 4, 10), // 8 more at 30s, 2 fit: 0, 20, 20, 30, 30
			{at: 30 * time.Second, cost: 1, want: no(0, 60*time.Second, 30*time.Second)},
			{at: 60 * time.Second, cost: 1, want: ok(0, 60*time.Second)}, // the entries of 0s have left
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
			{at: 0, key: "a", limit: &Limit{Algorithm: TokenBucket, Limit: 1, Period: time.Hour, Refunds: true}, want: ok(0, time.Hour)},
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
				got := make([]Decision, len(c.steps))
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
					wants[i].At = base.Add(s.at)
					if s.want.Allowed {
						wants[i].Cost = reqs[i].Cost
					}
				}
				for i := 0; i < len(c.steps); {
					clk.Set(base.Add(c.steps[i].at))
					if a := c.steps[i].adjust; a != nil {
						err := l.Adjust(ctx, reqs[a.of].Key, reqs[a.of].Limit, got[a.of], a.used)
						if a.capped && !errors.Is(err, ErrDebtCapped) || !a.capped && err != nil {
							t.Fatalf("step %d: %v (capped: %v)", i, err, a.capped)
						}
						i++
						continue
					}
					j := i + 1
					for all && j < len(c.steps) && c.steps[j].at == c.steps[i].at && c.steps[j].adjust == nil {
						j++
					}
					if all {
						ds, err := l.DecideAll(ctx, reqs[i:j])
						if err != nil {
							t.Fatalf("step %d: %v", i, err)
						}
						copy(got[i:j], ds)
					} else {
						d, err := l.Decide(ctx, reqs[i].Key, reqs[i].Limit, reqs[i].Cost)
						if err != nil {
							t.Fatalf("step %d: %v", i, err)
						}
						got[i] = d
					}
					for k, d := range got[i:j] {
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
	return fmt.Sprintf("{Allowed:%v Limit:%d Remaining:%d ResetAfter:%v RetryAfter:%v At:%s Cost:%d}",
		d.Allowed, d.Limit, d.Remaining, d.ResetAfter, d.RetryAfter, d.At.Format("15:04:05.000000"), d.Cost)
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
