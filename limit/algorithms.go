package limit

import (
	"math/bits"
	"time"
)

// This file holds the six algorithms as pure functions: a small state in, the state to keep and
// the Decision out, at an instant the caller passes. The memory store calls them under a lock;
// the Lua scripts in lua/ are line-for-line translations of them, so that both stores make the
// same decisions. Everything is integer arithmetic on microseconds since the Unix epoch (the
// resolution of Redis TIME), with every value below 2^53 so that Lua's doubles hold it exactly;
// Limit.Validate enforces the bounds.
//
// The zero value of every state is "no state": a full token bucket, an empty leaky bucket, no
// GCRA debt, empty windows and an empty log. A state is idle — equal in every future decision to
// the zero value — once ResetAfter has passed, so stores may forget it then.

// maxExact bounds the values the algorithms form, so that sums of two of them stay below 2^53.
const maxExact = 1 << 52

// MaxLogLimit is the largest Limit SlidingLog accepts: its state holds one timestamp per
// admitted request, so memory grows with Limit. SlidingWindow has no such bound.
const MaxLogLimit = 1 << 16

// tokenBucketState is a token bucket. The zero value is a full bucket.
type tokenBucketState struct {
	Tokens int64 // tokens in the bucket, scaled: one token is Unit
	Last   int64 // when Tokens was computed, µs since the Unix epoch
	Unit   int64 // the scale of Tokens (params.unit when it was stored); 0: no state
	Rec    peaks // the levels before its charges, for exact refunds (peaks.go)
}

// tokenBucket charges cost tokens if the bucket holds them. A rejection takes nothing.
// RetryAfter is the time until cost tokens exist, ResetAfter the time until the bucket is full.
func tokenBucket(s tokenBucketState, p params, cost int64, now time.Time) (tokenBucketState, Decision) {
	t := micros(now)
	switch {
	case s.Unit == 0:
		s.Tokens, s.Last, s.Unit = p.cap, t, p.unit
		s.Rec.reset(t - 1)
	case s.Unit != p.unit: // the limit changed since the state was stored
		s.Tokens, s.Unit = rescale(s.Tokens, s.Unit, p.unit), p.unit
		s.Rec.reset(t)
	}
	s.Tokens = min(s.Tokens, p.cap)
	if t < s.Last { // the key's clock never runs backwards
		t = s.Last
	}
	s.Tokens = fill(s.Tokens, p.cap, t-s.Last, p.refill)
	s.Last = t

	d := Decision{Limit: p.limit, At: instant(t)}
	need := cost * p.unit
	if s.Tokens >= need {
		d.Allowed, d.Cost = true, cost
		if p.rec {
			s.Rec.note(t, s.Tokens)
		} else {
			s.Rec.reset(t) // a charge not noted: the record knows nothing before it
		}
		s.Tokens -= need
	} else {
		d.RetryAfter = us(ceilDiv(need-s.Tokens, p.refill))
	}
	d.Remaining = max(0, s.Tokens) / p.unit
	d.ResetAfter = us(ceilDiv(p.cap-s.Tokens, p.refill))
	return s, d
}

// tokenBucketAdjust charges delta more tokens (delta > 0), down to -debt at most (capped
// reports that the rest was dropped), or refunds -delta tokens of a charge of charged tokens at
// at (µs): no more than the capacity less the highest level since (peaks.go), which leaves the
// bucket as if the charge had been that much less; or, when the record does not reach back to
// at, no more than the bucket has not refilled since (unrepaid); never beyond a full bucket. It
// returns the state and the µs until the bucket is full, or false when there is nothing to
// store: a refund to no state, or to a state kept under another limit, whose units the charge
// is not in.
func tokenBucketAdjust(s tokenBucketState, p params, at, charged, delta int64, now time.Time) (_ tokenBucketState, reset int64, ok, capped bool) {
	t := micros(now)
	switch {
	case delta < 0 && s.Unit != p.unit:
		return s, 0, false, false
	case s.Unit == 0:
		s.Tokens, s.Last, s.Unit = p.cap, t, p.unit
		s.Rec.reset(t - 1)
	case s.Unit != p.unit:
		s.Tokens, s.Unit = rescale(s.Tokens, s.Unit, p.unit), p.unit
		s.Rec.reset(t)
	}
	s.Tokens = min(s.Tokens, p.cap)
	t = max(t, s.Last)
	s.Tokens = fill(s.Tokens, p.cap, t-s.Last, p.refill)
	s.Last = t
	if delta > 0 {
		room := max(0, s.Tokens+p.debt)
		capped = delta*p.unit > room
		s.Rec.note(t, s.Tokens)
		s.Tokens -= min(delta*p.unit, room)
	} else {
		most := unrepaid(p, at, charged, t) // what was always safe to give back
		if m, known := s.Rec.highest(at, charged*p.unit, s.Tokens); known {
			most = max(most, p.cap-m)
		}
		give := max(0, min(-delta*p.unit, charged*p.unit, p.cap-s.Tokens, most))
		s.Tokens += give
		s.Rec.lift(at, give, p.cap, t)
	}
	return s, ceilDiv(p.cap-s.Tokens, p.refill), true, capped
}

// leakyBucketState is a leaky bucket used as a meter. The zero value is an empty bucket.
type leakyBucketState struct {
	Level int64 // what the bucket holds, scaled: one request is Unit
	Last  int64 // when Level was computed, µs since the Unix epoch
	Unit  int64 // the scale of Level; 0: no state
}

// leakyBucket pours cost units into the bucket if they fit. A rejection pours nothing.
// RetryAfter is the time until cost units fit, ResetAfter the time until the bucket is empty.
func leakyBucket(s leakyBucketState, p params, cost int64, now time.Time) (leakyBucketState, Decision) {
	t := micros(now)
	switch {
	case s.Unit == 0:
		s = leakyBucketState{Level: 0, Last: t, Unit: p.unit}
	case s.Unit != p.unit:
		s.Level, s.Unit = rescale(s.Level, s.Unit, p.unit), p.unit
	}
	if t < s.Last {
		t = s.Last
	}
	s.Level = drain(s.Level, t-s.Last, p.refill)
	s.Last = t

	d := Decision{Limit: p.limit, At: instant(t)}
	need := cost * p.unit
	if s.Level <= p.cap-need {
		d.Allowed, d.Cost = true, cost
		s.Level += need
	} else {
		d.RetryAfter = us(ceilDiv(s.Level-(p.cap-need), p.refill))
	}
	if s.Level < p.cap {
		d.Remaining = (p.cap - s.Level) / p.unit
	}
	d.ResetAfter = us(ceilDiv(s.Level, p.refill))
	return s, d
}

// leakyBucketAdjust pours delta more units in (delta > 0), up to Capacity + debt at most, or takes
// -delta units of a charge of charged units at at (µs) out, no more than has not leaked since
// (unrepaid) and never below empty; as tokenBucketAdjust, of which it is the mirror image.
func leakyBucketAdjust(s leakyBucketState, p params, at, charged, delta int64, now time.Time) (_ leakyBucketState, reset int64, ok, capped bool) {
	t := micros(now)
	switch {
	case delta < 0 && s.Unit != p.unit:
		return s, 0, false, false
	case s.Unit == 0:
		s = leakyBucketState{Level: 0, Last: t, Unit: p.unit}
	case s.Unit != p.unit:
		s.Level, s.Unit = rescale(s.Level, s.Unit, p.unit), p.unit
	}
	t = max(t, s.Last)
	s.Level = drain(s.Level, t-s.Last, p.refill)
	s.Last = t
	if delta > 0 {
		room := max(0, p.cap+p.debt-s.Level)
		capped = delta*p.unit > room
		s.Level += min(delta*p.unit, room)
	} else {
		s.Level -= min(-delta*p.unit, s.Level, unrepaid(p, at, charged, t))
	}
	return s, ceilDiv(s.Level, p.refill), true, capped
}

// gcraState is the theoretical arrival time of the next request, TAT + Frac/refill µs since the
// Unix epoch; Frac keeps the emission interval Period/Limit exact when it is not a whole number
// of microseconds. The zero value (a TAT in the past) means no debt.
type gcraState struct {
	TAT  int64 // µs since the Unix epoch
	Frac int64 // in 1/params.refill µs, < params.refill
}

// gcra admits a request when, after adding cost emission intervals to the TAT, the TAT is at
// most Capacity emission intervals ahead of now (the tolerance is Capacity-1 intervals). A
// rejection leaves the TAT as it was.
func gcra(s gcraState, p params, cost int64, now time.Time) (gcraState, Decision) {
	t := micros(now)
	if s.TAT < t {
		s = gcraState{TAT: t}
	}
	if s.Frac >= p.refill { // the limit changed since the state was stored
		s.Frac = p.refill - 1
	}
	// debt is TAT - now in units of 1/refill µs: one emission interval is unit of them, and
	// the tolerance plus one interval is cap.
	debt := (s.TAT-t)*p.refill + s.Frac
	d := Decision{Limit: p.limit, At: instant(t)}
	need := cost * p.unit
	if debt <= p.cap-need {
		d.Allowed, d.Cost = true, cost
		debt += need
		s.TAT, s.Frac = t+debt/p.refill, debt%p.refill
	} else {
		d.RetryAfter = us(ceilDiv(debt-(p.cap-need), p.refill))
	}
	if debt < p.cap {
		d.Remaining = (p.cap - debt) / p.unit
	}
	d.ResetAfter = us(ceilDiv(debt, p.refill))
	return s, d
}

// gcraAdjust moves the TAT delta emission intervals on (delta > 0), to at most Capacity + debt
// intervals ahead of now, or back by -delta intervals of a charge of charged at at (µs), no
// more than the charge has not been repaid since (unrepaid) and never before now; as
// tokenBucketAdjust, of which it is the third bookkeeping.
func gcraAdjust(s gcraState, p params, at, charged, delta int64, now time.Time) (_ gcraState, reset int64, ok, capped bool) {
	t := micros(now)
	if s.TAT < t {
		if delta < 0 {
			return s, 0, false, false
		}
		s = gcraState{TAT: t}
	}
	s.Frac = min(s.Frac, p.refill-1)
	debt := (s.TAT-t)*p.refill + s.Frac
	if delta > 0 {
		room := max(0, p.cap+p.debt-debt)
		capped = delta*p.unit > room
		debt += min(delta*p.unit, room)
	} else {
		debt -= min(-delta*p.unit, debt, unrepaid(p, at, charged, t))
	}
	s.TAT, s.Frac = t+debt/p.refill, debt%p.refill
	return s, ceilDiv(debt, p.refill), true, capped
}

// unrepaid returns how much of a charge of charged requests at at (µs) a bucket of p has not
// refilled by t, in its scaled units: charged × unit - (t - at) × refill, at least 0. It is the
// most a refund of that charge may give back (see the package doc, "Adjust").
func unrepaid(p params, at, charged, t int64) int64 {
	c := charged * p.unit
	if t <= at {
		return c
	}
	hi, lo := bits.Mul64(uint64(t-at), uint64(p.refill))
	if hi != 0 || lo >= uint64(c) {
		return 0
	}
	return c - int64(lo)
}

// fixedWindowState counts the requests admitted in one window. The zero value is no window.
// Count above Limit is debt (after Adjust, or a limit lowered since): each window that starts
// counts Limit of it, until it is paid.
type fixedWindowState struct {
	Start int64 // when the window started, µs since the Unix epoch
	Count int64
}

// carry is what a count of c leaves to count after k windows have ended, Limit of it in each.
func carry(c, k, limit int64) int64 {
	if c <= 0 || k >= ceilDiv(c, limit) {
		return 0
	}
	return c - k*limit // k < c/limit + 1 <= DebtCapacities + 2
}

// roll moves s to the window that starts at start, one window on at least (a window of a
// period changed since may start before start).
func (s fixedWindowState) roll(start, period, limit int64) fixedWindowState {
	if start == s.Start {
		return s
	}
	return fixedWindowState{Start: start, Count: carry(s.Count, max(1, (start-s.Start)/period), limit)}
}

// windowsWait is the µs until a window whose carried count is at most target starts, for a
// count of c and left µs left in the current window: the current one (0) if c <= target.
func windowsWait(c, target, limit, period, left int64) int64 {
	if c <= target {
		return 0
	}
	return left + (max(1, ceilDiv(c-target, limit))-1)*period
}

// fixedWindow admits a request if the window that holds now has room for cost more.
// RetryAfter is the time until a window with that room starts, ResetAfter the time until one
// with nothing carried into it starts (the end of the window when there is no debt).
func fixedWindow(s fixedWindowState, p params, cost int64, now time.Time) (fixedWindowState, Decision) {
	t := max(micros(now), s.Start) // the key's clock never runs backwards
	start := t - t%p.period
	s = s.roll(start, p.period, p.limit)
	left := start + p.period - t
	d := Decision{Limit: p.limit, At: instant(t)}
	if s.Count+cost <= p.limit {
		d.Allowed, d.Cost = true, cost
		s.Count += cost
	} else {
		d.RetryAfter = us(windowsWait(s.Count, p.limit-cost, p.limit, p.period, left))
	}
	d.ResetAfter = us(max(left, windowsWait(s.Count, 0, p.limit, p.period, left)))
	d.Remaining = max(0, p.limit-s.Count)
	return s, d
}

// fixedWindowAdjust counts delta more in the current window (delta > 0), up to Limit + debt
// (capped reports that the rest was dropped), or uncounts -delta of a charge at at (µs) if at
// is in the current window, never below 0. It returns the state and the µs until it is idle, or
// false when there is nothing to store.
func fixedWindowAdjust(s fixedWindowState, p params, at, delta int64, now time.Time) (_ fixedWindowState, reset int64, ok, capped bool) {
	t := max(micros(now), s.Start)
	start := t - t%p.period
	switch {
	case delta > 0:
		s = s.roll(start, p.period, p.limit)
		room := max(0, p.limit+p.debt-s.Count)
		capped = delta > room
		s.Count += min(delta, room)
	case s.Start == start && at-at%p.period == start:
		s.Count -= min(-delta, s.Count)
	default:
		return s, 0, false, false
	}
	left := start + p.period - t
	return s, max(left, windowsWait(s.Count, 0, p.limit, p.period, left)), true, capped
}

// slidingWindowState holds the counts of the current window and the one before it. The zero
// value is no window. Cur above Limit is debt (after Adjust, or a limit lowered since): each
// window that starts counts Limit of it, until it is paid.
type slidingWindowState struct {
	Start int64 // when the current window started, µs since the Unix epoch
	Prev  int64 // admitted in the window before
	Cur   int64 // admitted in the current window
}

// slidingWindow estimates the requests of the trailing period as
// floor(Prev × (µs left in the current window) / period) + Cur, and admits a request when the
// estimate plus cost is at most Limit. RetryAfter is the time until the estimate has fallen
// enough, ResetAfter the time until it is 0.
func slidingWindow(s slidingWindowState, p params, cost int64, now time.Time) (slidingWindowState, Decision) {
	t := max(micros(now), s.Start) // the key's clock never runs backwards
	start := t - t%p.period
	s = s.roll(start, p.period, p.limit)

	left := start + p.period - t // in (0, period]
	estimate := s.Prev*left/p.period + s.Cur
	d := Decision{Limit: p.limit, At: instant(t)}
	if estimate+cost <= p.limit {
		d.Allowed, d.Cost = true, cost
		s.Cur += cost
		estimate += cost
	} else {
		d.RetryAfter = us(slidingWait(s, p.period, left, p.limit-cost, p.limit))
	}
	d.Remaining = max(0, p.limit-estimate)
	d.ResetAfter = us(slidingWait(s, p.period, left, 0, p.limit))
	return s, d
}

// roll moves s to the window that starts at start, one window on at least (as fixedWindow's):
// after each window that ended, the previous count is what the current one counted, at most
// Limit, and the current count is the rest (the debt). A Prev above Limit (the limit was
// lowered) counts Limit.
func (s slidingWindowState) roll(start, period, limit int64) slidingWindowState {
	if start != s.Start {
		k := max(1, (start-s.Start)/period)
		s.Prev, s.Cur = min(carry(s.Cur, k-1, limit), limit), carry(s.Cur, k, limit)
	}
	s.Start = start
	s.Prev = min(s.Prev, limit)
	return s
}

// slidingWindowAdjust counts delta more in the current window (delta > 0), up to Limit + debt
// (capped reports that the rest was dropped), or uncounts -delta of a charge at at (µs) from
// the window it was counted in, if that is the current or the previous one, never below 0. It
// returns the state and the µs until the estimate is 0, or false when there is nothing to
// store.
func slidingWindowAdjust(s slidingWindowState, p params, at, delta int64, now time.Time) (_ slidingWindowState, reset int64, ok, capped bool) {
	t := max(micros(now), s.Start)
	start := t - t%p.period
	s = s.roll(start, p.period, p.limit)
	switch {
	case delta > 0:
		room := max(0, p.limit+p.debt-s.Cur)
		capped = delta > room
		s.Cur += min(delta, room)
	case at-at%p.period == start:
		s.Cur -= min(-delta, s.Cur)
	case at-at%p.period == start-p.period:
		s.Prev -= min(-delta, s.Prev)
	default:
		return s, 0, false, false
	}
	return s, slidingWait(s, p.period, start+p.period-t, 0, p.limit), true, capped
}

// slidingWait returns the µs until the estimate of s is at most target, if nothing more is
// admitted; left is the µs left in the current window. It looks at the current window and
// then at each one after it, as roll makes them, until the estimate falls to target in one:
// at most DebtCapacities + 3 of them.
//
// In a window with x µs left, floor(prev × x / period) + cur <= target holds exactly when
// cur <= target and prev × x < (target-cur+1) × period, that is for
// x <= ceil((target-cur+1) × period / prev) - 1 = xmax: the largest share of the window that
// may be left. xmax = 0 is no moment of the window (the next one starts with its own counts).
func slidingWait(s slidingWindowState, period, left, target, limit int64) int64 {
	wait := int64(0)
	for {
		if s.Cur <= target {
			if s.Prev == 0 {
				return wait
			}
			if xmax := ceilDiv((target-s.Cur+1)*period, s.Prev) - 1; xmax >= 1 {
				return wait + max(0, left-xmax)
			}
		}
		s.Prev, s.Cur = min(s.Cur, limit), carry(s.Cur, 1, limit)
		wait, left = wait+left, period
	}
}

// slidingLogState is the log of one key: the times of the admitted requests of the trailing
// period, oldest first, in a ring that holds up to Limit entries: allocated whole for a Limit up
// to 16, else grown by doubling from 16 as entries arrive. The zero value is an empty log.
type slidingLogState struct {
	ring []int64 // µs since the Unix epoch
	head int     // index of the oldest entry
	n    int     // number of entries
}

// at returns the i-th oldest entry.
func (s *slidingLogState) at(i int) int64 { return s.ring[(s.head+i)%len(s.ring)] }

// push appends cost entries of time t, growing the ring (to at most limit entries) if needed.
func (s *slidingLogState) push(t, cost, limit int64) {
	need := s.n + int(cost)
	if need > len(s.ring) {
		size := int(limit) // small logs get their whole ring at once
		if limit > 16 {
			size = max(need, min(int(limit), max(16, 2*len(s.ring))))
		}
		ring := make([]int64, size)
		for i := range s.n {
			ring[i] = s.at(i)
		}
		s.ring, s.head = ring, 0
	}
	for range cost {
		s.ring[(s.head+s.n)%len(s.ring)] = t
		s.n++
	}
}

// slidingLog drops the entries older than the trailing period and admits a request when the
// log has room for cost more entries; only admitted requests are logged. RetryAfter is the time
// until enough entries have left, ResetAfter the time until all have.
func slidingLog(s *slidingLogState, p params, cost int64, now time.Time) Decision {
	t := micros(now)
	if s.n > 0 {
		t = max(t, s.at(s.n-1))
	}
	for s.n > 0 && s.at(0) <= t-p.period {
		s.head = (s.head + 1) % len(s.ring)
		s.n--
	}
	d := Decision{Limit: p.limit, At: instant(t)}
	if int64(s.n)+cost <= p.limit {
		d.Allowed, d.Cost = true, cost
		s.push(t, cost, p.limit)
	} else {
		k := int64(s.n) + cost - p.limit // entries that must leave, k <= n
		d.RetryAfter = us(s.at(int(k-1)) + p.period - t)
	}
	d.Remaining = max(0, p.limit-int64(s.n))
	if s.n > 0 {
		d.ResetAfter = us(s.at(s.n-1) + p.period - t)
	}
	return d
}

// slidingLogAdjust logs delta more entries at now (delta > 0), as many as fit under Limit
// (capped reports that the rest was dropped: a log carries no debt), or removes up to -delta
// entries of instant at (µs), if they are still in the window. It returns the µs until the log
// is empty and the instant it adjusted at.
func slidingLogAdjust(s *slidingLogState, p params, at, delta int64, now time.Time) (reset, t int64, capped bool) {
	t = micros(now)
	if s.n > 0 {
		t = max(t, s.at(s.n-1))
	}
	for s.n > 0 && s.at(0) <= t-p.period {
		s.head = (s.head + 1) % len(s.ring)
		s.n--
	}
	switch {
	case delta > 0:
		room := max(0, p.limit-int64(s.n))
		capped = delta > room
		if room > 0 {
			s.push(t, min(delta, room), p.limit)
		}
	case at > t-p.period:
		s.remove(at, -delta)
	}
	if s.n > 0 {
		reset = s.at(s.n-1) + p.period - t
	}
	return reset, t, capped
}

// remove removes up to k entries of time at, keeping the log in order.
func (s *slidingLogState) remove(at, k int64) {
	i := 0
	for i < s.n && s.at(i) < at {
		i++
	}
	j := i
	for j < s.n && s.at(j) == at {
		j++
	}
	k = min(k, int64(j-i))
	for ; j < s.n; j++ {
		s.ring[(s.head+j-int(k))%len(s.ring)] = s.at(j)
	}
	s.n -= int(k)
}
