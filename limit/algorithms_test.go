package limit

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// randomLimit returns a valid limit of algorithm a, with rates that are and are not whole
// numbers of microseconds per request. Its charges are reconciled (Refunds), so a token
// bucket's refunds are exact.
func randomLimit(rng *rand.Rand, a Algorithm) Limit {
	limits := []int64{1, 2, 3, 5, 7, 10, 100}
	periods := []time.Duration{333 * µs, time.Millisecond, 7 * time.Millisecond, time.Second, 7 * time.Second, time.Minute, time.Hour}
	bursts := []int64{0, 0, 1, 3, 20}
	return Limit{
		Algorithm: a,
		Limit:     limits[rng.IntN(len(limits))],
		Period:    periods[rng.IntN(len(periods))],
		Burst:     bursts[rng.IntN(len(bursts))],
		Refunds:   true,
	}
}

// randomGap returns how far to move the clock before the next request.
func randomGap(rng *rand.Rand, period time.Duration) time.Duration {
	switch rng.IntN(5) {
	case 0:
		return 0
	case 1:
		return µs
	case 2:
		return time.Duration(rng.Int64N(int64(period/4/µs)+1)) * µs
	case 3:
		return time.Duration(rng.Int64N(int64(period/µs)+1)) * µs
	default:
		return time.Duration(rng.Int64N(3*int64(period/µs)+1)) * µs
	}
}

// model is a direct, slow implementation of an algorithm's definition, in exact rationals or
// from the full history of admitted requests, to check the integer code against.
type model struct {
	l       Limit
	period  int64      // µs
	level   *big.Rat   // buckets: tokens (token bucket, GCRA) or level (leaky bucket)
	last    int64      // buckets: time of level
	fresh   bool       // buckets: no request yet
	history [][2]int64 // windows: admitted (time, cost)
	born    int64      // token bucket: time of the first request
	charges []charge   // token bucket: what was taken, in order, after refunds
}

// charge is what a token bucket took at t: a request's cost less what was refunded of it, or an
// extra charge.
type charge struct {
	t      int64
	amount *big.Rat
}

func newModel(l Limit) *model {
	return &model{l: l, period: l.Period.Microseconds(), level: new(big.Rat), fresh: true}
}

// advance brings a bucket's level to t (µs).
func (m *model) advance(t int64) {
	capacity := big.NewRat(m.l.Capacity(), 1)
	leak := m.l.Algorithm == LeakyBucket
	if m.fresh {
		m.fresh = false
		m.born = t
		if !leak {
			m.level.Set(capacity)
		}
	} else {
		moved := big.NewRat((t-m.last)*m.l.Limit, m.period)
		if leak {
			m.level.Sub(m.level, moved)
			if m.level.Sign() < 0 {
				m.level.SetInt64(0)
			}
		} else {
			m.level.Add(m.level, moved)
			if m.level.Cmp(capacity) > 0 {
				m.level.Set(capacity)
			}
		}
	}
	m.last = t
}

// minRat returns the least of xs.
func minRat(xs ...*big.Rat) *big.Rat {
	m := xs[0]
	for _, x := range xs[1:] {
		if x.Cmp(m) < 0 {
			m = x
		}
	}
	return new(big.Rat).Set(m)
}

// adjust is the package doc's Adjust, by its definition: delta more units charged at t (µs),
// or -delta refunded of a charge of charged at at.
func (m *model) adjust(t, at, charged, delta int64) {
	lim := m.l.Limit
	switch m.l.Algorithm {
	case TokenBucket, GCRA, LeakyBucket:
		if m.fresh && delta < 0 {
			return
		}
		m.advance(t)
		capacity := big.NewRat(m.l.Capacity(), 1)
		debt := new(big.Rat).Sub(capacity, m.level) // what the bucket owes: 0 when full
		if m.l.Algorithm == LeakyBucket {
			debt.Set(m.level)
		}
		var change *big.Rat // added to debt
		if delta > 0 {
			most := new(big.Rat).Mul(capacity, big.NewRat(DebtCapacities+1, 1))
			room := new(big.Rat).Sub(most, debt) // owes DebtCapacities capacities beyond a full use at most
			change = minRat(big.NewRat(delta, 1), room)
		} else if m.l.Algorithm == TokenBucket {
			// What the bucket would hold now had the charge been -delta less, less what it
			// holds.
			i := slices.IndexFunc(m.charges, func(c charge) bool { return c.t == at })
			less := big.NewRat(-delta, 1)
			change = minRat(less, new(big.Rat).Sub(m.replay(t, i, less), m.level))
			m.charges[i].amount.Sub(m.charges[i].amount, change)
			change.Neg(change)
		} else {
			unrepaid := new(big.Rat).Sub(big.NewRat(charged, 1), big.NewRat((t-at)*lim, m.period))
			change = minRat(big.NewRat(-delta, 1), debt, unrepaid)
			if change.Sign() < 0 {
				change.SetInt64(0)
			}
			change.Neg(change)
		}
		if m.l.Algorithm == LeakyBucket {
			m.level.Add(m.level, change)
		} else {
			m.level.Sub(m.level, change)
		}
		if m.l.Algorithm == TokenBucket && delta > 0 {
			m.charges = append(m.charges, charge{t, change})
		}
		return
	}
	start := t / m.period * m.period
	switch {
	case delta > 0:
		var used int64
		switch m.l.Algorithm {
		case FixedWindow, SlidingWindow:
			used = m.in(start, start+m.period)
		case SlidingLog:
			used = m.in(t-m.period+1, t+1)
		}
		if add := min(delta, lim-used); add > 0 {
			m.history = append(m.history, [2]int64{t, add})
		}
		return
	case m.l.Algorithm == FixedWindow && at < start,
		m.l.Algorithm == SlidingWindow && at < start-m.period,
		m.l.Algorithm == SlidingLog && at <= t-m.period:
		return // the charge no longer counts
	}
	left := -delta
	for i := range m.history {
		if h := &m.history[i]; h[0] == at && left > 0 {
			take := min(left, h[1])
			h[1] -= take
			left -= take
		}
	}
}

// replay returns a token bucket's level at now, had its i-th charge taken less less: from a
// full bucket when the first request came, each charge taken at its instant.
func (m *model) replay(now int64, i int, less *big.Rat) *big.Rat {
	capacity := big.NewRat(m.l.Capacity(), 1)
	level, last := new(big.Rat).Set(capacity), m.born
	fill := func(t int64) {
		level.Add(level, big.NewRat((t-last)*m.l.Limit, m.period))
		if level.Cmp(capacity) > 0 {
			level.Set(capacity)
		}
		last = t
	}
	for j, c := range m.charges {
		fill(c.t)
		level.Sub(level, c.amount)
		if j == i {
			level.Add(level, less)
		}
	}
	fill(now)
	return level
}

// in returns the units admitted in [from, to).
func (m *model) in(from, to int64) (n int64) {
	for _, h := range m.history {
		if h[0] >= from && h[0] < to {
			n += h[1]
		}
	}
	return n
}

// decide returns whether a request of cost at t (µs) is admitted, and the remaining quota.
func (m *model) decide(t, cost int64) (bool, int64) {
	capacity := big.NewRat(m.l.Capacity(), 1)
	switch m.l.Algorithm {
	case TokenBucket, GCRA, LeakyBucket:
		leak := m.l.Algorithm == LeakyBucket
		m.advance(t)
		c := big.NewRat(cost, 1)
		free := new(big.Rat).Set(m.level) // what is free for requests
		if leak {
			free.Sub(capacity, m.level)
		}
		allowed := free.Cmp(c) >= 0
		if allowed {
			free.Sub(free, c)
			if leak {
				m.level.Add(m.level, c)
			} else {
				m.level.Sub(m.level, c)
			}
			if m.l.Algorithm == TokenBucket {
				m.charges = append(m.charges, charge{t, c})
			}
		}
		if free.Sign() < 0 {
			free.SetInt64(0)
		}
		return allowed, new(big.Int).Quo(free.Num(), free.Denom()).Int64()
	}

	in := m.in
	var used int64
	switch m.l.Algorithm {
	case FixedWindow:
		start := t / m.period * m.period
		used = in(start, start+m.period)
	case SlidingLog:
		used = in(t-m.period+1, t+1)
	case SlidingWindow:
		start := t / m.period * m.period
		prev, cur := in(start-m.period, start), in(start, start+m.period)
		used = prev*(start+m.period-t)/m.period + cur
	}
	allowed := used+cost <= m.l.Limit
	if allowed {
		m.history = append(m.history, [2]int64{t, cost})
		used += cost
	}
	return allowed, max(0, m.l.Limit-used)
}

// TestAlgorithmsMatchTheirDefinitions drives the memory store with random requests of random
// costs, and random adjustments of admitted ones (refunds and extra charges), and checks every
// decision against the model, and that RetryAfter and ResetAfter are exact: a request
// retried at RetryAfter is admitted and one a microsecond earlier is not; a request of the
// whole capacity is admitted at ResetAfter and not a microsecond earlier.
func TestAlgorithmsMatchTheirDefinitions(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seedFromEnv(1), 2))
	for _, a := range Algorithms {
		for range 40 {
			l := randomLimit(rng, a)
			clk := newClock(base)
			m := NewMemory(MemoryConfig{Now: clk.Now})
			ref := newModel(l)
			decide := func(cost int64, why string) Decision {
				t.Helper()
				d, err := m.Decide(ctx, "k", l, cost)
				if err != nil {
					t.Fatal(err)
				}
				now := clk.Now().UnixMicro()
				allowed, remaining := ref.decide(now, cost)
				if d.Allowed != allowed || d.Remaining != remaining {
					t.Fatalf("%+v at +%dµs cost %d (%s): got allowed %v remaining %d, definition says %v %d",
						l, now, cost, why, d.Allowed, d.Remaining, allowed, remaining)
				}
				if d.Allowed != (d.RetryAfter == 0) || d.ResetAfter < 0 || d.RetryAfter < 0 {
					t.Fatalf("%+v at +%dµs: inconsistent %s", l, now, show(d))
				}
				return d
			}
			var pending []Decision // admitted, not yet adjusted
			for range 200 {
				clk.Add(randomGap(rng, l.Period))
				if a == TokenBucket {
					// One charge a microsecond: the record of a token bucket keeps one level
					// for the charges of one microsecond, and refunds of those are exact only
					// for the first of them (see TestTokenBucketRefundBounds).
					clk.Add(µs)
				}
				if len(pending) > 0 && rng.IntN(3) == 0 {
					// Adjust one: mostly refunds (to a true cost below the charge), some extra
					// charges (up to three times the charge).
					i := rng.IntN(len(pending))
					pd := pending[i]
					pending = slices.Delete(pending, i, i+1)
					used := rng.Int64N(pd.Cost + 1)
					// Extra charges for the buckets; the windows' debt, carried window after
					// window, is in the conformance tables and TestRedisMatchesMemory.
					bucket := a == TokenBucket || a == GCRA || a == LeakyBucket
					if bucket && rng.IntN(4) == 0 {
						used = pd.Cost + rng.Int64N(2*pd.Cost+1)
					}
					if err := m.Adjust(ctx, "k", l, pd, used); err != nil {
						t.Fatal(err)
					}
					ref.adjust(clk.Now().UnixMicro(), pd.At.UnixMicro(), pd.Cost, used-pd.Cost)
					if a == TokenBucket {
						clk.Add(µs)
					}
				}
				cost := 1 + rng.Int64N(l.Capacity())
				d := decide(cost, "random")
				if d.Allowed {
					pending = append(pending, d)
				}
				switch {
				case !d.Allowed:
					clk.Add(d.RetryAfter - µs)
					if decide(cost, "a microsecond before RetryAfter").Allowed {
						t.Fatalf("%+v: admitted a microsecond before RetryAfter %v", l, d.RetryAfter)
					}
					clk.Add(µs)
					if !decide(cost, "at RetryAfter").Allowed {
						t.Fatalf("%+v: rejected at RetryAfter %v", l, d.RetryAfter)
					}
				case rng.IntN(4) == 0 && d.ResetAfter > 0:
					clk.Add(d.ResetAfter - µs)
					if decide(l.Capacity(), "whole capacity a microsecond before ResetAfter").Allowed {
						t.Fatalf("%+v: whole capacity admitted a microsecond before ResetAfter %v", l, d.ResetAfter)
					}
					clk.Add(µs)
					if !decide(l.Capacity(), "whole capacity at ResetAfter").Allowed {
						t.Fatalf("%+v: whole capacity rejected at ResetAfter %v", l, d.ResetAfter)
					}
				}
			}
		}
	}
}

// TestDebtWaitsExact drives every algorithm that carries debt with random requests and extra
// charges of up to five times a request's cost (so that keys owe several windows), and checks
// that RetryAfter and ResetAfter stay exact while a key owes: a request retried at RetryAfter
// is admitted and one a microsecond earlier is not; the whole capacity is admitted at
// ResetAfter and not a microsecond earlier.
func TestDebtWaitsExact(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seedFromEnv(7), 8))
	for _, a := range []Algorithm{TokenBucket, LeakyBucket, GCRA, FixedWindow, SlidingWindow} {
		for range 30 {
			l := randomLimit(rng, a)
			clk := newClock(base)
			m := NewMemory(MemoryConfig{Now: clk.Now})
			decide := func(cost int64) Decision {
				t.Helper()
				d, err := m.Decide(ctx, "k", l, cost)
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			for range 150 {
				clk.Add(randomGap(rng, l.Period))
				cost := 1 + rng.Int64N(l.Capacity())
				d := decide(cost)
				if d.Allowed && rng.IntN(2) == 0 {
					err := m.Adjust(ctx, "k", l, d, d.Cost+rng.Int64N(5*d.Cost+1))
					if err != nil && !errors.Is(err, ErrDebtCapped) {
						t.Fatal(err)
					}
					d = decide(cost)
				}
				switch {
				case !d.Allowed:
					clk.Add(d.RetryAfter - µs)
					if decide(cost).Allowed {
						t.Fatalf("%+v: admitted a microsecond before RetryAfter %v", l, d.RetryAfter)
					}
					clk.Add(µs)
					if !decide(cost).Allowed {
						t.Fatalf("%+v: rejected at RetryAfter %v", l, d.RetryAfter)
					}
				case rng.IntN(4) == 0 && d.ResetAfter > 0:
					clk.Add(d.ResetAfter - µs)
					if decide(l.Capacity()).Allowed {
						t.Fatalf("%+v: whole capacity admitted a microsecond before ResetAfter %v", l, d.ResetAfter)
					}
					clk.Add(µs)
					if !decide(l.Capacity()).Allowed {
						t.Fatalf("%+v: whole capacity rejected at ResetAfter %v", l, d.ResetAfter)
					}
				}
			}
		}
	}
}

// TestBucketsAgree checks that a token bucket, a leaky bucket and GCRA of equal capacity make
// the same decisions: they are three bookkeepings of one rule.
func TestBucketsAgree(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 4))
	for range 50 {
		l := randomLimit(rng, TokenBucket)
		l.Burst = l.Capacity()
		clk := newClock(base)
		m := NewMemory(MemoryConfig{Now: clk.Now})
		for range 200 {
			clk.Add(randomGap(rng, l.Period))
			cost := 1 + rng.Int64N(l.Capacity())
			var ds []Decision
			for _, a := range []Algorithm{TokenBucket, LeakyBucket, GCRA} {
				la := l
				la.Algorithm = a
				d, err := m.Decide(ctx, "k", la, cost)
				if err != nil {
					t.Fatal(err)
				}
				ds = append(ds, d)
			}
			if ds[0] != ds[1] || ds[0] != ds[2] {
				t.Fatalf("%+v cost %d: token bucket %s, leaky bucket %s, gcra %s", l, cost, show(ds[0]), show(ds[1]), show(ds[2]))
			}
		}
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		l    Limit
		want []error
	}{
		{Limit{Algorithm: TokenBucket, Limit: 10, Period: time.Second}, nil},
		{Limit{Algorithm: SlidingWindow, Limit: 100_000, Period: 24 * time.Hour}, nil},
		{Limit{Algorithm: TokenBucket, Limit: 100_000, Period: 24 * time.Hour, Burst: 100_000}, nil},
		{Limit{Algorithm: "leaky", Limit: 0, Period: -time.Second, Burst: -1},
			[]error{ErrUnknownAlgorithm, ErrInvalidLimit, ErrInvalidPeriod, ErrInvalidBurst}},
		{Limit{Algorithm: GCRA, Limit: 1, Period: 1500 * time.Nanosecond}, []error{ErrOutOfRange}},
		{Limit{Algorithm: SlidingLog, Limit: MaxLogLimit + 1, Period: time.Second}, []error{ErrOutOfRange}},
		{Limit{Algorithm: SlidingWindow, Limit: 1_000_000, Period: 24 * time.Hour}, []error{ErrOutOfRange}},
		{Limit{Algorithm: TokenBucket, Limit: 7, Period: 24 * time.Hour, Burst: 1 << 30}, []error{ErrOutOfRange}},
		{Limit{Algorithm: FixedWindow, Limit: 1 << 53, Period: time.Second}, []error{ErrOutOfRange}},
	}
	for _, tt := range tests {
		err := tt.l.Validate()
		if (err == nil) != (tt.want == nil) {
			t.Errorf("%+v: Validate() = %v, want errors %v", tt.l, err, tt.want)
		}
		for _, w := range tt.want {
			if !errors.Is(err, w) {
				t.Errorf("%+v: Validate() = %v, want it to wrap %v", tt.l, err, w)
			}
		}
	}
}

// TestRefundsNeverExceedTheLimit is the promise of Adjust: requests charged an estimate and
// refunded, after a random delay, down to a true cost at most the estimate, are admitted so
// that their true costs keep every bound the algorithm promises — at most Capacity + rate × t
// in any span t for the buckets and GCRA; at most Limit in any window for the fixed window, in
// any trailing Period for the sliding log, and in the estimate at every admission (and any
// fixed window) for the sliding window counter.
func TestRefundsNeverExceedTheLimit(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seedFromEnv(7), 8))
	type refund struct {
		d    Decision
		due  time.Time
		used int64
	}
	for _, a := range Algorithms {
		total := 0 // admitted requests, to be sure the test tests something
		for range 40 {
			l := randomLimit(rng, a)
			clk := newClock(base)
			m := NewMemory(MemoryConfig{Now: clk.Now})
			var admitted [][2]int64 // (µs, true cost)
			var pending []refund
			for range 300 {
				clk.Add(randomGap(rng, l.Period))
				now := clk.Now()
				rng.Shuffle(len(pending), func(i, j int) { pending[i], pending[j] = pending[j], pending[i] })
				pending = slices.DeleteFunc(pending, func(r refund) bool {
					if r.due.After(now) {
						return false
					}
					if err := m.Adjust(ctx, "k", l, r.d, r.used); err != nil {
						t.Fatal(err)
					}
					return true
				})
				estimate := 1 + rng.Int64N(l.Capacity())
				d, err := m.Decide(ctx, "k", l, estimate)
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed {
					continue
				}
				used := rng.Int64N(estimate + 1)
				admitted = append(admitted, [2]int64{d.At.UnixMicro(), used})
				if used < estimate {
					delay := time.Duration(rng.Int64N(int64(2*l.Period/µs)+1)) * µs
					if rng.IntN(3) == 0 {
						delay = 0
					}
					pending = append(pending, refund{d: d, due: now.Add(delay), used: used})
				}
			}
			if err := checkBound(l, admitted); err != nil {
				t.Fatalf("%+v: %v", l, err)
			}
			total += len(admitted)
		}
		if total == 0 {
			t.Fatalf("%s: nothing admitted", a)
		}
	}
}

// checkBound reports the first span in which the true costs of admitted (µs, cost), in order
// of time, exceed what l promises.
func checkBound(l Limit, admitted [][2]int64) error {
	period := l.Period.Microseconds()
	sum := func(from, to int64) (n int64) { // true costs in [from, to]
		for _, h := range admitted {
			if h[0] >= from && h[0] <= to {
				n += h[1]
			}
		}
		return n
	}
	for j, h := range admitted {
		t := h[0]
		start := t - t%period
		switch l.Algorithm {
		case TokenBucket, LeakyBucket, GCRA:
			for i := range j + 1 {
				s := admitted[i][0]
				// Σ ≤ Capacity + Limit × (t-s) / period, in whole numbers.
				if n := sum(s, t); n*period > l.Capacity()*period+l.Limit*(t-s) {
					return fmt.Errorf("%d units in [%d, %d]µs, more than %d + %d × %dµs / %dµs",
						n, s, t, l.Capacity(), l.Limit, t-s, period)
				}
			}
		case FixedWindow:
			if n := sum(start, start+period-1); n > l.Limit {
				return fmt.Errorf("%d units in the window from %dµs", n, start)
			}
		case SlidingLog:
			if n := sum(t-period+1, t); n > l.Limit {
				return fmt.Errorf("%d units in the period up to %dµs", n, t)
			}
		case SlidingWindow:
			prev, cur := sum(start-period, start-1), int64(0)
			for _, g := range admitted[:j+1] {
				if g[0] >= start {
					cur += g[1]
				}
			}
			if est := prev*(start+period-t)/period + cur; est > l.Limit {
				return fmt.Errorf("an estimate of %d at %dµs", est, t)
			}
		}
	}
	return nil
}

// mustIndex is index for tests of known algorithms.
func (a Algorithm) mustIndex() algo {
	i, ok := a.index()
	if !ok {
		panic("unknown algorithm " + string(a))
	}
	return i
}
