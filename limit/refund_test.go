package limit

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// The step tables of the token bucket's exact refund (peaks.go), run against every store with
// the other conformance cases. Each was worked out by hand as the bucket that had charged the
// true cost in the first place: a refund gives back the difference, less what that bucket
// would have lost to its capacity since.
func init() {
	tb := Limit{Algorithm: TokenBucket, Limit: 10, Period: 10 * time.Second, Refunds: true}
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

// TestTokenBucketRecordRedisMatchesMemory drives both stores with the shapes the record has to
// get right: a bucket drained a little at a time (the record full, its oldest levels dropped),
// several charges and refunds in one microsecond (shared and mixed levels), up to 30 requests
// in flight refunded in any order, and an old-format state (as stored before the record
// existed, which knows nothing before its last instant). Every decision must be the same on
// both, to the microsecond.
func TestTokenBucketRecordRedisMatchesMemory(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seedFromEnv(42), 43))
	full, dropped := 0, 0
	for run := range 30 {
		l := Limit{Algorithm: TokenBucket, Limit: 1 + rng.Int64N(100), Period: time.Duration(1+rng.IntN(1000)) * time.Millisecond, Burst: 40, Refunds: true}
		clk := newClock(base)
		mem := NewMemory(MemoryConfig{Now: clk.Now})
		prefix := testenv.Prefix(t) + strconv.Itoa(run) + ":"
		red := NewRedis(srv.Client, RedisConfig{Prefix: prefix, Now: clk.Now})
		var pending []Decision
		for i := range 300 {
			clk.Add(time.Duration(rng.IntN(3)) * µs * time.Duration(1+rng.IntN(2000)*rng.IntN(2)))
			if len(pending) > 0 && (len(pending) > 30 || rng.IntN(3) == 0) {
				j := rng.IntN(len(pending))
				d := pending[j]
				pending = slices.Delete(pending, j, j+1)
				used := rng.Int64N(d.Cost)
				if err := mem.Adjust(ctx, "k", l, d, used); err != nil {
					t.Fatal(err)
				}
				if err := red.Adjust(ctx, "k", l, d, used); err != nil {
					t.Fatal(err)
				}
				continue
			}
			cost := 1 + rng.Int64N(3)
			dm, err := mem.Decide(ctx, "k", l, cost)
			if err != nil {
				t.Fatal(err)
			}
			dr, err := red.Decide(ctx, "k", l, cost)
			if err != nil {
				t.Fatal(err)
			}
			if dm != dr {
				t.Fatalf("run %d step %d %+v cost %d at %v: redis %s, memory %s", run, i, l, cost, clk.Now().Sub(base), show(dr), show(dm))
			}
			if dm.Allowed {
				pending = append(pending, dm)
			}
			for s := range mem.shards {
				for _, r := range mem.shards[s].t.peaks {
					if len(r.List) == maxPeaks {
						full++
					}
					if r.Since > micros(base) {
						dropped++
					}
				}
			}
		}
	}
	if full == 0 || dropped == 0 {
		t.Fatalf("the record was never full (%d) or never dropped a level (%d)", full, dropped)
	}

	// A state stored before the record existed: tokens, last, unit. A refund of a charge made
	// before it gives back what has not refilled since, as it used to; a charge after it is
	// refunded exactly.
	l := Limit{Algorithm: TokenBucket, Limit: 10, Period: 10 * time.Second, Refunds: true} // a token a second
	p, _ := l.validate()
	clk := newClock(base)
	red := NewRedis(srv.Client, RedisConfig{Prefix: testenv.Prefix(t) + "old:", Now: clk.Now})
	// 2 tokens left at base, after a charge of 8 at base from a full bucket.
	var old []byte
	for _, v := range []int64{2 * p.unit, micros(base), p.unit} {
		old = binary.AppendUvarint(old, uint64(v))
	}
	if err := srv.Client.Set(ctx, red.key("k", algTokenBucket), old, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	clk.Set(base.Add(5 * time.Second))
	second, err := red.Decide(ctx, "k", l, 4) // 7 tokens, 3 left
	if err != nil || !second.Allowed {
		t.Fatalf("%s, %v", show(second), err)
	}
	clk.Set(base.Add(6 * time.Second)) // 4 tokens
	// The charge of 8 at base: 8 - 6 has not refilled since, 2 back (had it been 0, the bucket
	// would hold 7 now: the exact refund, 3, needs the levels since base, which it lacks).
	if err := red.Adjust(ctx, "k", l, Decision{Allowed: true, Cost: 8, At: base}, 0); err != nil {
		t.Fatal(err)
	}
	if d, _ := red.Decide(ctx, "k", l, 7); d.Allowed || d.Remaining != 6 {
		t.Fatalf("after the refund of a charge older than the record: %s, want 6 tokens left", show(d))
	}
	// The charge of 4 at 5 s, refunded whole: the bucket would have held 9, then 10 now.
	if err := red.Adjust(ctx, "k", l, second, 0); err != nil {
		t.Fatal(err)
	}
	if d, _ := red.Decide(ctx, "k", l, 10); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after the exact refund: %s, want the whole capacity admitted", show(d))
	}
}
