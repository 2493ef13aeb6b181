package regions

import (
	"maps"
	"math"
	"time"
)

// Record is the coordinator's state of one global budget: one key of the coordinator's
// bucket, holding every region's lease. Whoever renews a lease reads it, applies the rule
// (Renew) and writes it back on the revision it read (compare-and-set), so concurrent
// renewals, from one region's workers or from several regions, are serialised by the
// coordinator and none is lost.
type Record struct {
	// Budget is the global rate in deliveries per second, as the last writer configured it.
	Budget float64 `json:"budget"`
	// HoldUntil is when a record created afresh starts handing out shares: the coordinator
	// may have lost a state whose leases are still held, so it waits out the longest lease.
	HoldUntil time.Time `json:"hold_until"`
	// Leases are the regions' leases, by region name.
	Leases map[string]Lease `json:"leases"`
}

// Lease is one region's share of a global budget for a bounded time.
type Lease struct {
	// Share is the deliveries per second the region may send until Expires.
	Share   float64   `json:"share"`
	Expires time.Time `json:"expires"`
	// Demand is the rate the region last asked for (its backlog drained within a renew
	// period), and Renewed when: a region that renewed within a lease period takes part in the
	// division, even with no share yet (a record's hold, a budget others still hold).
	Demand  float64   `json:"demand"`
	Renewed time.Time `json:"renewed"`
	// Was is a larger share the region held before its last renewal lowered it, counted as
	// held until WasUntil: the region's other workers apply the lower share only at their
	// next read, so the freed budget is handed out once none of them can still use it.
	Was      float64   `json:"was,omitempty"`
	WasUntil time.Time `json:"was_until,omitzero"`
	// Retry, when set (never stored), is when a renewal may get more: the region's share is
	// below its target because another region still holds budget that it stops holding then
	// (a lowered share stops lingering, or a lease expires), within one renew period. A
	// holder that renews again then follows a shift without waiting for its next period.
	Retry time.Time `json:"-"`
}

// Terms are a region's settings for one renewal.
type Terms struct {
	Budget  float64       // the global rate, deliveries per second
	Minimum float64       // min_share, deliveries per second
	Lease   time.Duration // how long a lease lasts
	Renew   time.Duration // how often a worker renews; the longest a lowered share may linger
	Hold    time.Duration // how long a fresh record hands out nothing; default Lease
	Lingers time.Duration // slack beyond Renew before a lowered share is freed (reserved slots, skew)
}

// held is the share a lease counts for at now: 0 once expired; its former share while that
// may still be in use.
func (l Lease) held(now time.Time) float64 {
	if !now.Before(l.Expires) {
		if now.Before(l.WasUntil) {
			return l.Was
		}
		return 0
	}
	if now.Before(l.WasUntil) {
		return max(l.Share, l.Was)
	}
	return l.Share
}

// Fresh returns the record a coordinator without state starts from at now: it hands out
// nothing until every lease of a state it may have lost has expired.
func Fresh(t Terms, now time.Time) Record {
	hold := t.Hold
	if hold <= 0 {
		hold = t.Lease
	}
	return Record{Budget: t.Budget, HoldUntil: now.Add(hold), Leases: map[string]Lease{}}
}

// Renew applies the coordinator's rule for region's renewal at now, with the region's demand,
// to rec, and returns the record to write back and the region's lease in it. The rule:
//
//   - the target shares are Divide(budget, demands, minimum) over the regions whose lease has
//     not expired or who renewed within a lease period, with region's new demand;
//   - region's new share is its target, but never more than the budget less what every other
//     region holds now (held: its unexpired share, or a lowered share's former value while
//     it may linger): so the sum of the shares of unexpired leases never exceeds the budget;
//   - a lowered share keeps its former value counted (Was) for Renew+Lingers;
//   - while the record is held (HoldUntil), region gets share 0 with no time (its lease is
//     expired at once), so it runs on its last lease, then its safe share.
//
// Expired leases stay in the record (the regions that take part), but count for nothing.
// Renew does not change rec.
func Renew(rec Record, region string, demand float64, t Terms, now time.Time) (Record, Lease) {
	out := Record{Budget: t.Budget, HoldUntil: rec.HoldUntil, Leases: maps.Clone(rec.Leases)}
	if out.Leases == nil {
		out.Leases = map[string]Lease{}
	}
	old := out.Leases[region]
	if math.IsNaN(demand) || demand < 0 {
		demand = 0
	}
	if now.Before(rec.HoldUntil) {
		l := Lease{Expires: now, Demand: demand, Renewed: now}
		l.Was, l.WasUntil = lingering(old, 0, now, old.Expires)
		out.Leases[region] = l
		return out, l
	}
	demands := map[string]float64{region: demand}
	others := 0.0
	for r, l := range out.Leases {
		if r == region {
			continue
		}
		others += l.held(now)
		if now.Before(l.Expires) || now.Before(l.Renewed.Add(t.Lease)) {
			demands[r] = l.Demand
		}
	}
	target := Divide(t.Budget, demands, t.Minimum)[region]
	share := max(0, min(target, t.Budget-others))
	l := Lease{Share: share, Expires: now.Add(t.Lease), Demand: demand, Renewed: now}
	l.Was, l.WasUntil = lingering(old, share, now, now.Add(t.Renew+t.Lingers))
	out.Leases[region] = l
	if share < target {
		l.Retry = freed(out.Leases, region, now, now.Add(t.Renew))
	}
	return out, l
}

// freed is the first instant after now and before by at which a region other than region
// holds less (its lowered share stops lingering, or its lease expires); zero if none does.
func freed(leases map[string]Lease, region string, now, by time.Time) time.Time {
	var at time.Time
	earliest := func(t time.Time) {
		if t.After(now) && t.Before(by) && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	for r, l := range leases {
		if r == region {
			continue
		}
		if l.Was > 0 {
			earliest(l.WasUntil)
		}
		if l.Share > 0 || l.Was > 0 {
			earliest(l.Expires)
		}
	}
	return at
}

// lingering is what a lease replacing old with share at now must still count as held (Was)
// and until when: old's share, while old is unexpired and above share, until until; and old's
// own lingering share while it lasts. Both together, conservatively, when both apply.
func lingering(old Lease, share float64, now, until time.Time) (float64, time.Time) {
	var was float64
	var wasUntil time.Time
	if now.Before(old.WasUntil) && old.Was > share {
		was, wasUntil = old.Was, old.WasUntil
	}
	if now.Before(old.Expires) && old.Share > share {
		was = max(was, old.Share)
		if until.After(wasUntil) {
			wasUntil = until
		}
	}
	return was, wasUntil
}

// Held is the sum of what every region holds at now: never more than the budget while every
// writer follows Renew.
func (r Record) Held(now time.Time) float64 {
	s := 0.0
	for _, l := range r.Leases {
		s += l.held(now)
	}
	return s
}
