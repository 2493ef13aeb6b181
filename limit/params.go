package limit

import (
	"fmt"
	"math/bits"
	"sync/atomic"
	"time"
)

// algo is an Algorithm as a small integer, for tables indexed by algorithm.
type algo uint8

const (
	algTokenBucket algo = iota
	algLeakyBucket
	algFixedWindow
	algSlidingLog
	algSlidingWindow
	algGCRA
	numAlgos
)

// params is a valid Limit in the integer form the algorithms compute with.
type params struct {
	alg      algo
	limit    int64 // Limit
	capacity int64 // Capacity()
	period   int64 // Period in µs
	// The bucket algorithms and GCRA count in scaled units, so that the refill of any elapsed
	// number of microseconds is a whole number of them: one token is unit, and refill units
	// arrive per µs. With g = gcd(Limit, period), unit = period/g and refill = Limit/g, so
	// refill/unit = Limit/period exactly.
	unit   int64
	refill int64
	cap    int64 // Capacity() × unit
	// debt is the most a key may owe beyond a full use of its capacity after Adjust charged
	// more than a decision did, in the algorithm's units (scaled for the buckets and GCRA):
	// DebtCapacities capacities, or what exact arithmetic holds above the capacity if less.
	// SlidingLog owes nothing (0): its log holds at most Limit entries.
	debt int64
	rec  bool // a TokenBucket keeps its record of levels (Limit.Refunds)
}

// DebtCapacities is how many capacities of debt a key may carry after Adjust charged the
// true cost of its requests above what they were admitted at: a key that owes more has the
// rest dropped (Adjust returns ErrDebtCapped). Debt is paid at the limit's rate, across as many
// windows as it takes, before the key is admitted again.
const DebtCapacities = 100

// debtFor is DebtCapacities × c, or maxExact - c when that is less.
func debtFor(c int64) int64 {
	if c <= maxExact/DebtCapacities {
		return DebtCapacities * c
	}
	return maxExact - c
}

// index returns a as an algo, and whether it is a known algorithm.
func (a Algorithm) index() (algo, bool) {
	switch a {
	case TokenBucket:
		return algTokenBucket, true
	case LeakyBucket:
		return algLeakyBucket, true
	case FixedWindow:
		return algFixedWindow, true
	case SlidingLog:
		return algSlidingLog, true
	case SlidingWindow:
		return algSlidingWindow, true
	case GCRA:
		return algGCRA, true
	}
	return 0, false
}

// params checks that l, of algorithm alg, is within the bounds of exact arithmetic and converts
// it. l has already passed the basic checks of validate.
func (l Limit) params(alg algo) (params, error) {
	p := params{alg: alg, limit: l.Limit, capacity: l.Limit, rec: l.Refunds && alg == algTokenBucket}
	switch alg {
	case algTokenBucket, algGCRA, algLeakyBucket:
		switch {
		case l.Burst > 0:
			p.capacity = l.Burst
		case alg == algLeakyBucket:
			p.capacity = 1
		}
	}
	if l.Period%time.Microsecond != 0 {
		return params{}, fmt.Errorf("%w: period %v is not a whole number of microseconds", ErrOutOfRange, l.Period)
	}
	p.period = int64(l.Period / time.Microsecond)
	switch {
	case p.period > maxExact:
		return params{}, fmt.Errorf("%w: period %v is too long", ErrOutOfRange, l.Period)
	case l.Limit > maxExact, l.Burst > maxExact:
		return params{}, fmt.Errorf("%w: limit or burst above 2^52", ErrOutOfRange)
	}
	switch p.alg {
	case algTokenBucket, algLeakyBucket, algGCRA:
		p.unit, p.refill = p.period, l.Limit
		if g := gcd(l.Limit, p.period); g > 1 {
			p.unit, p.refill = p.period/g, l.Limit/g
		}
		if hi, lo := bits.Mul64(uint64(p.capacity), uint64(p.unit)); hi != 0 || lo > maxExact {
			return params{}, fmt.Errorf("%w: capacity %d × period %v too large for exact arithmetic; shorten the period or lower the burst",
				ErrOutOfRange, p.capacity, l.Period)
		}
		p.cap = p.capacity * p.unit
		p.debt = debtFor(p.cap)
	case algSlidingWindow:
		if hi, lo := bits.Mul64(uint64(l.Limit+1), uint64(p.period)); hi != 0 || lo > 2*maxExact {
			return params{}, fmt.Errorf("%w: limit %d × period %v too large for exact arithmetic", ErrOutOfRange, l.Limit, l.Period)
		}
		p.debt = debtFor(l.Limit)
	case algFixedWindow:
		p.debt = debtFor(l.Limit)
	case algSlidingLog:
		if l.Limit > MaxLogLimit {
			return params{}, fmt.Errorf("%w: sliding_log keeps one timestamp per request and accepts a limit of at most %d; use sliding_window",
				ErrOutOfRange, MaxLogLimit)
		}
	}
	return p, nil
}

// paramsCache remembers the params of recently used limits: a service applies a handful of
// limits from its configuration to every request, and converting one (a GCD and two divisions)
// costs more than the rest of a memory store's decision. It is direct-mapped by a hash of the
// limit, and lock-free: a slot holds an immutable entry, replaced whole.
var paramsCache [256]atomic.Pointer[paramsCacheEntry]

type paramsCacheEntry struct {
	l Limit
	p params
}

// cachedParams is validate through paramsCache. Only valid limits are cached.
func (l Limit) cachedParams() (params, error) {
	h := (uint64(l.Limit)*0x9e3779b97f4a7c15 ^ uint64(l.Period)*0xc2b2ae3d27d4eb4f ^
		uint64(l.Burst)*0x165667b19e3779f9 ^ uint64(len(l.Algorithm))) >> 56
	slot := &paramsCache[h]
	if e := slot.Load(); e != nil && e.l == l {
		return e.p, nil
	}
	p, err := l.validate()
	if err == nil {
		slot.Store(&paramsCacheEntry{l: l, p: p})
	}
	return p, err
}
