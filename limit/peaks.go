package limit

// This file holds the record that makes a token bucket's refunds exact (see the package doc,
// "Units and Adjust"). lua/peaks.lua is the same computation for the Redis store.
//
// A refund of e units of a charge made at t0 gives back what the bucket would hold now had the
// charge been e units less: the same bucket, e higher from t0 on, except that refilling stops at
// the capacity, so the difference shrinks to capacity − level whenever the level rises that
// high. The refund is therefore min(e, capacity − the highest level since the charge). Between
// two charges the level only rises (refill, refunds), so that highest level is the level just
// before some later charge, or the level now; the record keeps those levels, each with its
// instant, as a stack whose levels fall from oldest to newest (a level no higher than a later
// one can never be the highest since any instant, and is dropped). A query is a walk of the
// stack.

// maxPeaks is the most levels a token bucket's record keeps. When a charge would make it hold
// more, the oldest is dropped and Since moves to its instant: a refund of a charge made then or
// before gives back what unrepaid allows, as before the record existed. The record holds more
// than a few levels only while the bucket drains charge after charge: under a steady load, the
// levels before charges go up and down, and a level is dropped by any later one as high, so
// that n charges since the bucket was last full leave about ln n levels. Each level costs the
// Redis scripts about 1.5 µs (BENCHMARKS.md).
const maxPeaks = 8

// peak is the level a token bucket held just before a charge.
type peak struct {
	At    int64 // µs since the Unix epoch
	Level int64 // scaled tokens, > 0
	Mixed bool  // a refund at At came between charges at At: Level may follow some of them
}

// peaks is a token bucket's record of the levels before its charges (see above). The record
// is complete after Since: every charge later than Since left its level in List, or a higher
// level at a later instant.
type peaks struct {
	Since int64 // µs since the Unix epoch
	List  []peak
}

// reset empties the record; charges at or before since are then refunded by unrepaid.
func (r *peaks) reset(since int64) {
	r.Since, r.List = since, r.List[:0]
}

// note records that the bucket held level just before a charge at t (t at least every
// instant recorded). Charges in one microsecond share one level, the highest before any of
// them: without a refund between them, each one's level is the one before it less its charge,
// so the level after any of them is at most that level less its charge. A level of 0 or below
// is not recorded: whatever the highest level since a charge, if it is at most 0, the refund is
// whole (e ≤ the charge ≤ capacity).
func (r *peaks) note(t, level int64) {
	if level <= 0 {
		return
	}
	n := len(r.List)
	mixed := false
	if n > 0 && r.List[n-1].At == t {
		mixed, level = r.List[n-1].Mixed, max(level, r.List[n-1].Level)
		n--
	}
	for n > 0 && r.List[n-1].Level <= level {
		n--
	}
	r.List = r.List[:n]
	if n == maxPeaks {
		r.Since = r.List[0].At
		r.List = append(r.List[:0], r.List[1:]...)
	}
	r.List = append(r.List, peak{At: t, Level: level, Mixed: mixed})
}

// highest returns the highest level the bucket held since a charge of charge scaled tokens at
// at, now holding level now; false when the record does not reach back to at. The level just
// after the charge is at most the level recorded at at less the charge (unless a refund came
// between the charges of that microsecond: then the level recorded counts whole).
func (r *peaks) highest(at, charge, now int64) (int64, bool) {
	if at <= r.Since {
		return 0, false
	}
	m := now
	for _, e := range r.List {
		if e.At < at {
			continue
		}
		if e.At == at && !e.Mixed {
			m = max(m, e.Level-charge)
			continue
		}
		return max(m, e.Level), true // the first later level is the highest of the rest
	}
	return m, true
}

// lift raises the levels recorded after a charge at at by give, what a refund of it at t gave
// back (never above capacity), so that they are those of the bucket as if the charge had been
// give less; drops the levels that are then no higher than a later one; and marks the level
// recorded at t, if any, mixed: a later charge at t may start from a level higher than what the
// charges before the refund left.
func (r *peaks) lift(at, give, capacity, t int64) {
	if give <= 0 {
		return
	}
	for i := range r.List {
		if e := &r.List[i]; e.At > at || e.At == at && e.Mixed {
			e.Level = min(capacity, e.Level+give)
		}
	}
	keep, top := len(r.List), int64(-1)
	for i := len(r.List) - 1; i >= 0; i-- {
		if r.List[i].Level > top {
			keep--
			r.List[keep], top = r.List[i], r.List[i].Level
		}
	}
	r.List = append(r.List[:0], r.List[keep:]...)
	if n := len(r.List); n > 0 && r.List[n-1].At == t {
		r.List[n-1].Mixed = true
	}
}
