package worker

import (
	"context"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/regions"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/queue"
)

// Regions is this deployment's part in global budgets (Deps.Regions): a queue with
// QueueConfig.Global shares its rate, and its unit budget (cost_rate) by the same fraction,
// with the other regions through leases renewed on the coordinator (internal/regions). Nil:
// no regions; Global is ignored.
type Regions struct {
	// Coordinator renews this region's leases (a *regions.Coordinator).
	Coordinator LeaseRenewer
	// Regions is how many regions share the budgets: an even safe share is the budget ÷ it.
	Regions int
	// SafeShare is what the region may use, in deliveries per second, once its lease expired
	// while it cannot renew; < 0: even (the budget ÷ Regions); 0: nothing (a strict budget).
	SafeShare float64
	// MinShare is the least share the coordinator gives a region with a lease, per second.
	MinShare float64
	// Lease is how long a lease lasts; Renew, how often each worker renews it (< Lease).
	Lease, Renew time.Duration
}

// LeaseRenewer keeps one holder's (this worker process's) leases of queues' global budgets;
// *regions.Coordinator is one.
type LeaseRenewer interface {
	// Renew renews the lease, calling lower with the share a write gives before the write.
	Renew(ctx context.Context, queue string, demand float64, t regions.Terms, lower func(share float64)) (regions.Lease, regions.Record, error)
	// Release gives the holder's entry up (the worker stops).
	Release(ctx context.Context, queue string, t regions.Terms) error
	// Watch calls soon, until ctx ends, when a change of the record makes a renewal matter.
	Watch(ctx context.Context, queue string, terms func() regions.Terms, soon func(at time.Time))
}

// leaseLingers is how long a worker's lowered share stays counted after the write that
// lowered it (regions.Terms.Lingers): the worker applies the lower share before the write
// (regionalLease.lower), so what is left are the slots and units it reserved ahead at the
// former share (reserveAhead, 100 ms; unitAhead, 20 ms) and a scheduling delay (100 ms).
const leaseLingers = reserveAhead + 100*time.Millisecond

// renewGap is the least time between two renewals of a lease asked by its record's changes or
// by a Retry: every holder sees every write, and a change answered by a renewal is one more
// write.
const renewGap = 100 * time.Millisecond

// backlogReader reads a queue's depth, for the region's demand; *queue.Queues is one.
type backlogReader interface {
	Info(ctx context.Context, name string) (queue.Info, error)
}

// regionalLease is the policy of a global queue's regional lease: its share of the global rate
// lowers the leak slot's rate (rate, through leakSlot.learned) and, as a fraction, the unit
// budget (fraction, through unitBudget.ask), a share too small for one
// delivery per renew period holds jobs until the next renewal (admit), and run renews the lease
// every Renew with the region's demand: its backlog drained within one renew period. When
// renewals fail the region uses its lease until it expires, then its safe share. Safe for
// concurrent use.
type regionalLease struct {
	env     queueEnv
	reg     *Regions      // nil: no regions
	backlog backlogReader // nil: demand is the whole budget
	// meanCost is the mean cost of the queue's jobs lately (unitBudget.meanCost), for the
	// demand of a queue with a unit budget; nil or 0: demand counts jobs only.
	meanCost func() float64

	mu       sync.Mutex
	lease    regions.Lease // the last lease renewed; zero: none yet
	onSafe   bool          // the last share read was the safe share
	warned   bool          // the region's expired lease was logged, and its return not yet
	since    time.Time     // when the region began to run without a lease (onSafe)
	lost     bool          // the region has run without a lease for longer than lostAfter
	failures int           // renewals failed in a row
	// showing is the share sluice_region_share was last set to (shareGauge, made at the
	// first share read).
	showing    float64
	shareGauge prometheus.Gauge
}

// on reports whether the queue of cfg is global in a deployment with regions.
func (rl *regionalLease) on(cfg *QueueConfig) bool { return rl.reg != nil && cfg.Global }

// share is the rate the region may use now, in deliveries per second, and whether the queue is
// global: its lease's share until it expires, then its safe share.
func (rl *regionalLease) share() (float64, bool) {
	cfg := rl.env.cfg()
	if !rl.on(cfg) {
		return 0, false
	}
	now := rl.env.now()
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if now.Before(rl.lease.Expires) {
		rl.safe(false, 0, now)
		return rl.shown(rl.lease.Share), true
	}
	budget := perSecond(cfg.Rate)
	safe := min(rl.reg.SafeShare, budget)
	if rl.reg.SafeShare < 0 {
		safe = budget / float64(max(rl.reg.Regions, 1))
	}
	rl.safe(true, safe, now)
	return rl.shown(safe), true
}

// shown sets sluice_region_share to s when it changed, so that the metric follows the share
// as it is used, and returns s; rl.mu is held.
func (rl *regionalLease) shown(s float64) float64 {
	if s != rl.showing || rl.shareGauge == nil {
		if rl.shareGauge == nil {
			rl.shareGauge = rl.env.m.regionShare.WithLabelValues(rl.env.name)
		}
		rl.shareGauge.Set(s)
		rl.showing = s
	}
	return s
}

// safe records whether the region runs on its safe share (the metric), and logs a change from
// a lease that expired unrenewed and the return to a lease; rl.mu is held.
func (rl *regionalLease) safe(on bool, share float64, now time.Time) {
	if on == rl.onSafe {
		return
	}
	rl.onSafe, rl.since = on, now
	g := rl.env.m.regionOnSafe.WithLabelValues(rl.env.name)
	switch {
	case !on:
		g.Set(0)
		if rl.warned {
			rl.warned = false
			rl.env.log.Info("worker: region runs on its lease of a global queue again", "queue", rl.env.name)
		}
	case rl.lease.Expires.IsZero():
		g.Set(1) // no lease yet: the start, or a coordinator waiting out a lost state's leases
	default:
		g.Set(1)
		rl.warned = true
		rl.env.log.Warn("worker: region runs on its safe share of a global queue: its lease expired unrenewed",
			"queue", rl.env.name, "share_per_second", strconv.FormatFloat(share, 'f', 2, 64))
	}
}

// lostAfter is how long a region may run without a lease before it counts as lost (the alert,
// sluice_region_lease_lost): a lease and a renew period, since a region that starts while the
// coordinator is new waits one lease (the record's hold) and up to one renewal for its first.
func (rl *regionalLease) lostAfter() time.Duration { return rl.reg.Lease + rl.reg.Renew }

// checkLost raises the alert once the region has run without a lease for longer than
// lostAfter, with one log line per episode, and lowers it when a lease comes back.
func (rl *regionalLease) checkLost() {
	now := rl.env.now()
	rl.mu.Lock()
	defer rl.mu.Unlock()
	lost := rl.onSafe && now.Sub(rl.since) > rl.lostAfter()
	g := rl.env.m.regionLost.WithLabelValues(rl.env.name) // shown as 0 from the first renewal
	if lost == rl.lost {
		return
	}
	rl.lost = lost
	if !lost {
		g.Set(0)
		return
	}
	g.Set(1)
	rl.env.log.Error("worker: region has held no lease of a global queue for longer than a lease; it runs on its safe share",
		"queue", rl.env.name, "since", rl.since, "expired", rl.lease.Expires, "renewal_failures", rl.failures)
}

// rate is the region's share for the leak slot: > 0 lowers the queue's rate to it; 0 (not
// global) leaves it. A share below one delivery per renew period (0 included: a strict safe
// share, a lease that gives nothing yet) is raised to that: admit holds new jobs then, and
// the jobs admitted before the share fell, already waiting for their slots, get at most one
// per renew period, not the queue's whole rate (a rate of 0 would leave the slot at it, and
// a smaller one would reserve their slots past the next renewal).
func (rl *regionalLease) rate() float64 {
	s, ok := rl.share()
	if !ok {
		return 0
	}
	return max(s, 1/rl.reg.Renew.Seconds())
}

// fraction is the region's part of the queue's global budgets now, share ÷ rate in [0, 1]:
// the leak slot runs at share = fraction × rate, and the unit budget at fraction × cost_rate
// and fraction × cost_burst (unitBudget.ask). 1 when the queue is not global (or has no rate).
// One lease, divided by the job backlog, thus shares both budgets (docs/design/regions.md).
func (rl *regionalLease) fraction() float64 {
	s, ok := rl.share()
	budget := perSecond(rl.env.cfg().Rate)
	if !ok || budget <= 0 {
		return 1
	}
	return min(max(s/budget, 0), 1)
}

// minUnitFraction is the least fraction of a unit budget a region asks for while its share is
// above 0: a unit budget stretched further would overflow the unit schedule's arithmetic. A
// share that small (1/10 000 of the rate) is below one delivery per renew period for any rate
// under 4 000/s at the default renew, and held by admit before it reaches the unit budget.
const minUnitFraction = 1e-4

// regionalUnits is u lowered to the region's fraction f of it: the same units over a period
// 1/f times as long (exact where scaling N would round), and f of its burst, rounded down.
// f ≥ 1 leaves u; f is raised to minUnitFraction.
func regionalUnits(u leaky.Units, f float64) leaky.Units {
	if f >= 1 || u.IsZero() {
		return u
	}
	f = max(f, minUnitFraction)
	u.Per = time.Duration(math.Ceil(float64(u.Per) / f))
	u.Burst = int64(float64(u.Burst) * f)
	return u
}

// admit holds a global queue's job while the region's share is too small for one delivery per
// renew period (a leak slot at that rate would be reserved beyond the next renewal), until then.
func (rl *regionalLease) admit(context.Context, *QueueConfig, *job) verdict {
	s, ok := rl.share()
	if !ok || s*rl.reg.Renew.Seconds() >= 1 {
		return pass()
	}
	return holdUntil(rl.env.now().Add(rl.reg.Renew), "the region's share of the global rate is too small")
}

// run keeps the lease while ctx lasts: renewed every Renew while the queue is global, and in
// between when a change of the record makes a renewal matter (the coordinator's Watch: another
// holder of the region lowered its share, another region asks for more, budget is free) or
// when budget the region is short of frees up (Lease.Retry); released when ctx ends.
func (rl *regionalLease) run(ctx context.Context) {
	if rl.reg == nil {
		return
	}
	p := regions.NewPacer(renewGap)
	watching, renewed := false, false
	p.Run(ctx, rl.reg.Renew, func(ctx context.Context, _ bool) bool {
		if !rl.on(rl.env.cfg()) {
			return false
		}
		if !watching { // from the first renewal of a global queue on
			watching = true
			go rl.reg.Coordinator.Watch(ctx, rl.env.name, rl.terms, p.Soon)
		}
		l, ok := rl.renewOnce(ctx)
		renewed = renewed || ok
		if ok && !l.Retry.IsZero() {
			p.Soon(l.Retry.Add(regions.RetryLag))
		}
		return l.Raced
	})
	if renewed {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rl.reg.Renew)
		defer cancel()
		_ = rl.reg.Coordinator.Release(rctx, rl.env.name, rl.terms())
	}
}

// renew renews the lease once (the tests' step).
func (rl *regionalLease) renew(ctx context.Context) { rl.renewOnce(ctx) }

// terms are the terms of the lease's next renewal.
func (rl *regionalLease) terms() regions.Terms {
	return regions.Terms{Budget: perSecond(rl.env.cfg().Rate), Minimum: rl.reg.MinShare, Lease: rl.reg.Lease,
		Renew: rl.reg.Renew, Lingers: leaseLingers}
}

// lower applies share at once if it is below the unexpired lease's: a renewal's write is
// about to lower the worker's acknowledged share, and only what it reserved ahead before
// now may still be spent at the former one once the write lands (leaseLingers).
func (rl *regionalLease) lower(share float64) {
	now := rl.env.now()
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if now.Before(rl.lease.Expires) && share < rl.lease.Share {
		rl.lease.Share = share
		rl.shown(share)
	}
}

// renewOnce renews the lease once, with the region's demand, and returns the lease and
// whether the renewal succeeded.
func (rl *regionalLease) renewOnce(ctx context.Context) (regions.Lease, bool) {
	cfg := rl.env.cfg()
	budget := perSecond(cfg.Rate)
	demand := rl.demand(ctx, budget)
	t := rl.terms()
	ctx, cancel := context.WithTimeout(ctx, t.Deadline())
	defer cancel()
	l, _, err := rl.reg.Coordinator.Renew(ctx, rl.env.name, demand, t, rl.lower)
	defer func() {
		if s, ok := rl.share(); ok {
			rl.env.m.regionShare.WithLabelValues(rl.env.name).Set(s)
			rl.checkLost()
		}
	}()
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if err != nil {
		rl.env.m.regionFailure.WithLabelValues(rl.env.name).Inc()
		if rl.failures++; rl.failures == 1 {
			rl.env.log.Warn("worker: cannot renew the region's lease of a global queue; using it until it expires",
				"queue", rl.env.name, "expires", rl.lease.Expires, "err", err)
		}
		return l, false
	}
	if rl.failures > 0 {
		rl.env.log.Info("worker: the region's lease of a global queue renews again", "queue", rl.env.name)
	}
	rl.failures = 0
	if l.Expires.After(rl.env.now()) { // else the coordinator is waiting out a lost state's leases
		rl.lease = l
		rl.env.m.regionExpiry.WithLabelValues(rl.env.name).Set(float64(l.Expires.UnixMilli()) / 1000)
	}
	return l, true
}

// demand is the region's demand for the queue's global rate: its backlog drained within one
// renew period, so that a region keeps its share until its backlog is nearly gone; the whole
// budget when the backlog cannot be read. With a unit budget, what the backlog needs of it
// (at the mean cost of its jobs lately), as the same fraction of the rate, when that is more:
// one lease's fraction lowers both budgets, so a region needs the larger part.
func (rl *regionalLease) demand(ctx context.Context, budget float64) float64 {
	if rl.backlog == nil {
		return budget
	}
	ctx, cancel := context.WithTimeout(ctx, rl.reg.Renew)
	defer cancel()
	info, err := rl.backlog.Info(ctx, rl.env.name)
	if err != nil {
		return budget
	}
	jobs := math.Max(0, float64(info.Depth)/rl.reg.Renew.Seconds())
	perSec := unitsPerSecond(rl.env.cfg().Units)
	if rl.meanCost == nil || perSec <= 0 {
		return jobs
	}
	return math.Max(jobs, jobs*rl.meanCost()/perSec*budget)
}
