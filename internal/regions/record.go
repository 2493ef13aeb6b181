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

// Lease is one region's share of a global budget for a bounded time: the latest renewal of
// any of its holders, and each holder's acknowledged share.
type Lease struct {
	// Share is the deliveries per second the region's latest renewal was given, until Expires.
	Share   float64   `json:"share"`
	Expires time.Time `json:"expires"`
	// Demand is the rate the region last asked for (its backlog drained within a renew
	// period), and Renewed when: a region that renewed within a lease period takes part in the
	// division, even with no share yet (a record's hold, a budget others still hold).
	Demand  float64   `json:"demand"`
	Renewed time.Time `json:"renewed"`
	// Holders are the shares the region's holders (each worker or ingress process, by its
	// random id) last applied, each until its own expiry: the region counts, for the others,
	// the largest of them, since its holders share one leak schedule (its Redis). A holder's
	// share changes only by its own renewal (its acknowledgement), so a share lowered by one
	// holder stays counted until every other holder has renewed or expired.
	Holders map[string]Ack `json:"holders,omitempty"`
	// Retry, when set (never stored), is when a renewal may get more: the region's share is
	// below its target because another region still holds budget that it stops holding then
	// (a lowered share stops lingering, or a lease expires), within one renew period. A
	// holder that renews again then follows a shift without waiting for its next period.
	Retry time.Time `json:"-"`
	// Raced (never stored) reports that the renewal lost a compare-and-set race to another
	// writer first: holders renewing in step, which a Pacer spreads apart.
	Raced bool `json:"-"`
}

// Ack is one holder's acknowledged share: what it applies until Expires (then its safe
// share), and, after its own renewal lowered it, the former share until WasUntil, for the
// slots it reserved ahead before it applied the lower one (Terms.Lingers).
type Ack struct {
	Share    float64   `json:"share"`
	Expires  time.Time `json:"expires"`
	Was      float64   `json:"was,omitempty"`
	WasUntil time.Time `json:"was_until,omitzero"`
}

// Terms are a region's settings for one renewal.
type Terms struct {
	Budget  float64       // the global rate, deliveries per second
	Minimum float64       // min_share, deliveries per second
	Lease   time.Duration // how long a lease lasts
	Renew   time.Duration // how often a holder renews at the latest
	Hold    time.Duration // how long a fresh record hands out nothing; default Lease
	// Lingers is how long a holder's former share stays counted after its own renewal lowered
	// it: the holder applies the lower share before the write (Coordinator.Renew's lower), so
	// only what it reserved ahead at the former share (slots, units) and a scheduling delay.
	Lingers time.Duration
}

// Deadline is how long one renewal may take: half a lease, and at least a renew period. Each
// compare-and-set that loses a race costs another round trip to the coordinator, over a
// gateway a slow one; a renewal cut short at one renew period failed after a single conflict
// on a loaded machine. A holder renewing at most a period apart still renews before its lease
// (the longer of the two) expires.
func (t Terms) Deadline() time.Duration { return max(t.Renew, t.Lease/2) }

// held is the share an acknowledgement counts for at now: 0 once expired; its former share
// while the slots reserved ahead at it may still be spent.
func (a Ack) held(now time.Time) float64 {
	s := 0.0
	if now.Before(a.Expires) {
		s = a.Share
	}
	if now.Before(a.WasUntil) {
		s = max(s, a.Was)
	}
	return s
}

// held is what a region counts for at now: the largest share any of its holders may apply;
// a record written before holders were kept (no Holders) counts its unexpired share.
func (l Lease) held(now time.Time) float64 {
	if len(l.Holders) == 0 {
		if now.Before(l.Expires) {
			return l.Share
		}
		return 0
	}
	s := 0.0
	for _, a := range l.Holders {
		s = max(s, a.held(now))
	}
	return s
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

// Renew applies the coordinator's rule for holder's renewal of region's lease at now, with the
// region's demand, to rec, and returns the record to write back and the region's lease in it.
// The rule:
//
//   - the target shares are Divide(budget, demands, minimum) over the regions whose lease has
//     not expired or who renewed within a lease period, with region's new demand;
//   - holder's new share is its region's target, but never more than the budget less what
//     every other region holds now (held: the largest share any of its holders acknowledged
//     and has not expired, or a lowered one's former share while it lingers);
//   - holder's entry is replaced by its new share, until now + Lease; a lowered share's
//     former value is counted for Lingers more. The other holders' entries stay as they are:
//     a share one holder lowered is counted for its region until the others acknowledge it;
//   - while the record is held (HoldUntil), holder gets share 0 with no time (its lease is
//     expired at once), so it runs on its last lease, then its safe share.
//
// So the sum over the regions of the largest share any holder may apply never exceeds the
// budget. Entries expired and no longer lingering are dropped; expired leases stay (the
// regions that take part) but count for nothing. Renew does not change rec.
func Renew(rec Record, region, holder string, demand float64, t Terms, now time.Time) (Record, Lease) {
	out := Record{Budget: t.Budget, HoldUntil: rec.HoldUntil, Leases: make(map[string]Lease, len(rec.Leases)+1)}
	for r, l := range rec.Leases {
		out.Leases[r] = pruned(l, now)
	}
	old := out.Leases[region]
	if math.IsNaN(demand) || demand < 0 {
		demand = 0
	}
	if now.Before(rec.HoldUntil) {
		l := acked(old, holder, Ack{Expires: now}, t, now)
		l.Share, l.Expires, l.Demand, l.Renewed = 0, now, demand, now
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
	l := acked(old, holder, Ack{Share: share, Expires: now.Add(t.Lease)}, t, now)
	l.Share, l.Expires, l.Demand, l.Renewed = share, now.Add(t.Lease), demand, now
	out.Leases[region] = l
	if share < target {
		l.Retry = freed(out.Leases, region, now, now.Add(t.Renew))
	}
	return out, l
}

// Release is rec with holder's entry in region's lease given up at now (a holder that stops
// cleanly): its share counts only while the slots it reserved ahead may still be spent
// (Lingers), then not at all, instead of until its lease would have expired.
func Release(rec Record, region, holder string, t Terms, now time.Time) Record {
	out := Record{Budget: rec.Budget, HoldUntil: rec.HoldUntil, Leases: maps.Clone(rec.Leases)}
	if l, ok := out.Leases[region]; ok {
		out.Leases[region] = acked(pruned(l, now), holder, Ack{Expires: now}, t, now)
	}
	return out
}

// acked is l with holder's entry replaced by a at now, the entry's former share kept as Was
// for t.Lingers when a lowers it (or its own former share while that still lingers). The
// other holders' entries are l's.
func acked(l Lease, holder string, a Ack, t Terms, now time.Time) Lease {
	hs := make(map[string]Ack, len(l.Holders)+1)
	maps.Copy(hs, l.Holders)
	if old, ok := hs[holder]; ok {
		if now.Before(old.WasUntil) && old.Was > a.Share {
			a.Was, a.WasUntil = old.Was, old.WasUntil
		}
		if now.Before(old.Expires) && old.Share > a.Share {
			a.Was = max(a.Was, old.Share)
			if until := now.Add(t.Lingers); until.After(a.WasUntil) {
				a.WasUntil = until
			}
		}
	}
	hs[holder] = a
	l.Holders = hs
	return l
}

// pruned is l without the entries that count for nothing at now and never will again; with
// none left, its share is 0 (else it would count as a record written before holders were kept).
func pruned(l Lease, now time.Time) Lease {
	if len(l.Holders) == 0 {
		return l
	}
	hs := make(map[string]Ack, len(l.Holders))
	for h, a := range l.Holders {
		if now.Before(a.Expires) || now.Before(a.WasUntil) {
			hs[h] = a
		}
	}
	l.Holders = hs
	if len(hs) == 0 {
		l.Share = 0
	}
	return l
}

// freed is the first instant after now and before by at which a region other than region
// holds less (a lowered share stops lingering, or an entry expires); zero if none does.
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
		if len(l.Holders) == 0 && l.Share > 0 {
			earliest(l.Expires)
		}
		for _, a := range l.Holders {
			if a.Was > 0 {
				earliest(a.WasUntil)
			}
			if a.Share > 0 || a.Was > 0 {
				earliest(a.Expires)
			}
		}
	}
	return at
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
