package limit

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// The step tables of the token bucket's exact refund (peaks.go), run against every store with
// the other conformance cases. Each was worked out by hand as the bucket that had charged the
// true cost in the first place: a refund gives back the difference, less what that bucket
// would have lost to its capacity since.
func init() {
	tb := Limit{Algorithm: TokenBucket, Limit: 10, Period: 10 * time.Second}
	conformanceCases = append(conformanceCases, []struct {
		name  string
		limit Limit
		steps []step
	}{
		{
			// Charged 0 first, the bucket would have held 10, 6 at 5 s (4 charged), 7 at 6 s:
			// 3 more than the 4 it holds, where "what has not refilled" (8 - 6) says 2.
			name:  "token_bucket/refund: what the bucket would hold had the charge been less",
			limit: tb,
			steps: []step{
				{at: 0, cost: 8, want: ok(2, 8*time.Second)},
				{at: 5 * time.Second, cost: 4, want: ok(3, 7*time.Second)},
				fix(6*time.Second, 0, 0),
				{at: 6 * time.Second, cost: 8, want: no(7, 3*time.Second, time.Second)},
				{at: 6 * time.Second, cost: 7, want: ok(0, 10*time.Second)},
			},
		},
		{
			// A refund long after its charge (14 s, 1.4 periods): charged 0, the bucket would
			// have held 10, then 4 after each of the charges at 4, 8 and 12 s, and 6 now: 4 more
			// than now. What has not refilled since (8 - 14) is nothing.
			name:  "token_bucket/refund: a charge long ago, the bucket never full since",
			limit: tb,
			steps: []step{
				{at: 0, cost: 8, want: ok(2, 8*time.Second)},
				{at: 4 * time.Second, cost: 6, want: ok(0, 10*time.Second)},
				{at: 8 * time.Second, cost: 4, want: ok(0, 10*time.Second)},
				{at: 12 * time.Second, cost: 4, want: ok(0, 10*time.Second)},
				fix(14*time.Second, 0, 0),
				{at: 14 * time.Second, cost: 7, want: no(6, 4*time.Second, time.Second)},
				{at: 14 * time.Second, cost: 6, want: ok(0, 10*time.Second)},
			},
		},
		{
			// The bucket was full at 6 s, after the charge: a smaller charge would have been
			// lost to the capacity then, so nothing comes back.
			name:  "token_bucket/refund: nothing once the bucket has been full since",
			limit: tb,
			steps: []step{
				{at: 0, cost: 5, want: ok(5, 5*time.Second)},
				{at: 6 * time.Second, cost: 10, want: ok(0, 10*time.Second)},
				fix(6*time.Second, 0, 0),
				{at: 6 * time.Second, cost: 1, want: no(0, 10*time.Second, time.Second)},
			},
		},
		{
			// Two refunds, the older charge first. Charged 0 at 0, the bucket would have held 10,
			// 9 at 1 s, 10 from 2 s, 5 at 5 s: 1 more than the 4 it holds. Charged 0 at 1 s
			// too, it would hold the same 5: the second refund gives nothing, although the
			// levels the bucket really had (6 at 1 s, 9 at 5 s) never reached 10.
			name:  "token_bucket/refund: a second refund counts the first",
			limit: tb,
			steps: []step{
				{at: 0, cost: 5, want: ok(5, 5*time.Second)},
				{at: time.Second, cost: 1, want: ok(5, 5*time.Second)},
				{at: 5 * time.Second, cost: 5, want: ok(4, 6*time.Second)},
				fix(5*time.Second, 0, 0),
				fix(5*time.Second, 1, 0),
				{at: 5 * time.Second, cost: 6, want: no(5, 5*time.Second, time.Second)},
				{at: 5 * time.Second, cost: 5, want: ok(0, 10*time.Second)},
			},
		},
	}...)
}

// TestTokenBucketRefundBounds drives the token bucket's pure functions with many requests in
// flight (up to 40, so that the record of maxPeaks levels falls short), several charges in one
// microsecond, and refunds in any order, and checks after every step, against a replay of
// what the bucket took (each request's cost less what was refunded of it, from a full bucket):
//   - a refund gives back at most the units refunded, and never less than the old rule
//     (what has not refilled since the charge, never beyond a full bucket);
//   - the bucket never holds more than the replay: no refund leaves it more permissive than
//     charging the true cost at first would have;
//   - in every span between two decisions, what the admitted requests took is at most the
//     capacity plus the rate times the span (the hard limit).
func TestTokenBucketRefundBounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(seedFromEnv(40), 41))
	var exact, beyondOld, fellBack, refunds int
	for range 200 {
		l := randomLimit(rng, TokenBucket)
		drain := rng.IntN(3) == 0 // small charges close together: more levels than the record keeps
		if drain {
			l.Burst = 40
		}
		p, err := check("k", l, 1)
		if err != nil {
			t.Fatal(err)
		}
		type took struct{ t, amount int64 } // scaled units
		var (
			s       tokenBucketState
			taken   []took
			pending []int // indices into taken of requests not yet reconciled
			costs   = map[int]int64{}
			now     = base
			born    int64
		)
		replay := func(at int64) int64 {
			level, last := p.cap, born
			for _, c := range taken {
				level = fill(level, p.cap, c.t-last, p.refill) - c.amount
				last = c.t
			}
			return fill(level, p.cap, at-last, p.refill)
		}
		for range 400 {
			switch {
			case drain:
				now = now.Add(time.Duration(rng.IntN(3)) * µs)
			case rng.IntN(3) > 0:
				now = now.Add(randomGap(rng, l.Period) / time.Duration(1+rng.IntN(8)))
			}
			tn := micros(now)
			if len(pending) > 0 && (len(pending) > 40 || rng.IntN(3) == 0) {
				j := rng.IntN(len(pending))
				i := pending[j]
				pending = slices.Delete(pending, j, j+1)
				charged := costs[i]
				used := rng.Int64N(charged)
				level := fill(s.Tokens, p.cap, max(tn, s.Last)-s.Last, p.refill)
				old := max(0, min((charged-used)*p.unit, p.cap-level, unrepaid(p, taken[i].t, charged, max(tn, s.Last))))
				since := s.Rec.Since
				s2, _, ok, _ := tokenBucketAdjust(s, p, taken[i].t, charged, used-charged, now)
				if !ok {
					t.Fatalf("%+v: a refund found no state", l)
				}
				give := s2.Tokens - level
				if give < old || give > (charged-used)*p.unit {
					t.Fatalf("%+v: refund of %d of a charge of %d gave back %d scaled, the old rule %d", l, charged-used, charged, give, old)
				}
				refunds++
				if give > old {
					beyondOld++
				}
				if taken[i].t <= since {
					fellBack++
				}
				s = s2
				taken[i].amount -= give
			} else {
				cost := 1 + rng.Int64N(l.Capacity())
				if drain {
					cost = 1 + rng.Int64N(3)
				}
				var d Decision
				if s.Unit == 0 {
					born = tn
				}
				s, d = tokenBucket(s, p, cost, now)
				if d.Allowed {
					taken = append(taken, took{tn, cost * p.unit})
					costs[len(taken)-1] = cost
					pending = append(pending, len(taken)-1)
				}
			}
			r := replay(s.Last)
			if s.Tokens > r {
				t.Fatalf("%+v: the bucket holds %d scaled, more than had the true costs been charged (%d)", l, s.Tokens, r)
			}
			if s.Tokens == r {
				exact++
			}
		}
		for i := range taken {
			for j := i; j < len(taken); j++ {
				var sum int64
				for _, c := range taken[i : j+1] {
					sum += c.amount
				}
				if most := p.cap + (taken[j].t-taken[i].t)*p.refill; sum > most {
					t.Fatalf("%+v: %d scaled taken from +%dµs to +%dµs, at most %d", l, sum, taken[i].t-micros(base), taken[j].t-micros(base), most)
				}
			}
		}
	}
	t.Logf("%d refunds: %d gave back more than the old rule, %d of charges older than the record; the bucket held what the replay says after %d of 80000 steps", refunds, beyondOld, fellBack, exact)
	if beyondOld == 0 || fellBack == 0 {
		t.Fatal("the test did not exercise both the record and its fallback")
	}
}
