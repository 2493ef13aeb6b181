package worker

import (
	"context"
	"errors"
	"time"

	"github.com/sluice-rl/sluice/inflight"
	"github.com/sluice-rl/sluice/retry"
)

// A queue with max_in_flight, or a fair queue with tenant_in_flight (or a tenant's own
// in_flight set by an operator), caps its deliveries in flight at once across every worker of
// every process. Each delivery holds a place of the queue's cap and of its tenant's (package
// inflight: one sorted set per cap in Redis, all of one queue in one hash slot) from before its
// leak slot until its answer, or its timeout, has ended: the places policy comes before the
// slot's in the admission order, and the pass releases them once the delivery ends. Places come before the slot, so
// that a delivery leaves at its slot: a slot taken first and used whenever a place came free
// would bunch deliveries up.
//
// A place is held for at most slotBudget + Timeout + placeMargin from its acquisition, and a
// job whose slot came later than slotBudget after its places renews them for Timeout +
// placeMargin from then (one more round trip, only then). So a worker that crashes or stops
// mid-delivery frees its places within the queue's timeout plus a margin of placeMargin
// (slotBudget + placeMargin at most), and never before its request's own deadline has passed.
// The Pool's store (inflight.Reuse) takes each place for a second longer, and gives a place
// released by one delivery to the next of the same caps while that second lasts and the cap
// has room: the margin is a second more, and a drain under a cap it does not reach pays a
// take and a release per place per second instead of per job.
//
// A Redis that lost the places (a restart without persistence, a FLUSHALL, a Redis Cluster
// failover to a replica that had not got the last ones) would hand the cap
// out again while the deliveries holding them still run. The store fences the queue's caps
// then (package inflight): no place is granted for hold − PlaceMargin (Timeout + 3s: the slot
// budget, the timeout and the Reuser's second) from the loss, and each worker puts back the
// places it still holds and counts the loss in sluice_place_store_resets_total.

const (
	// slotBudget is how long a job waits for its leak slot on the places' first hold.
	slotBudget = 2 * time.Second
	// placeMargin covers the clocks of the worker and Redis, the release's round trip, and the
	// time a request's answer takes to be read after its deadline.
	placeMargin = 3 * time.Second
)

// PlaceMargin is the part of each hold a Pool asks of its place store that is margin, not
// use: a delivery uses its places at most hold − PlaceMargin after taking them (the slot's
// budget, the timeout, and the Reuser's spare). A Redis place store fences a group for that
// long after a loss of its state (inflight.WithMargin).
const PlaceMargin = placeMargin

// placeHold is how long a delivery of a queue with config cfg holds its places from their
// acquisition, at most, before its slot.
func placeHold(cfg *QueueConfig) time.Duration { return slotBudget + cfg.Timeout + placeMargin }

// placeKey is the key of queue's cap in the place store: one hash tag per queue, so that the
// queue's and a tenant's cap are taken by one script on Redis Cluster.
func placeKey(queue string) string { return "{q:" + queue + "}" }

// tenantPlaceKey is the key of tenant's cap of queue in the place store.
func tenantPlaceKey(queue, tenant string) string { return placeKey(queue) + ":t:" + tenant }

// PlaceKeys are the keys, in a Deps.Places store, of the places held by queue's deliveries
// and, when tenant is not "", by tenant's, for a reader such as the admin API.
func PlaceKeys(queue, tenant string) []string {
	if tenant == "" {
		return []string{placeKey(queue)}
	}
	return []string{placeKey(queue), tenantPlaceKey(queue, tenant)}
}

// places is the policy of a queue's concurrency caps. Safe for concurrent use.
type places struct {
	env   queueEnv
	store placeStore // the Pool's inflight.Reuser
	// settling bounds the calls that give places back: it ends a grace after shutdown.
	settling context.Context
	// health is the Pool's view of its Redis, shared with the leak slot: a store that fails
	// for storeGiveUp marks it down (the Pool hands its jobs back and fetches none until it
	// answers), and a take ends at once when another job found it down.
	health *scheduleHealth
}

// admit waits for a place of every cap the job's delivery must hold (caps); the pass ends,
// not sent, when ctx ends first or the store cannot be reached for storeGiveUp (the job is
// handed back, for a worker that can reach it). Its verdict's valid renews the places for a
// job whose slot came later than slotBudget after them; when they expired meanwhile, the job
// takes both again (the slot goes unused).
func (p *places) admit(ctx context.Context, cfg *QueueConfig, j *job) verdict {
	caps := p.caps(cfg, j.m.Job.Tenant)
	if len(caps) == 0 {
		return pass()
	}
	lease, acquired, err := p.take(ctx, caps, placeHold(cfg))
	if err != nil {
		return refuse(endNotSent, err.Error())
	}
	return verdict{
		release: func() { p.release(lease, cfg) },
		valid:   func() bool { return p.env.now().Sub(acquired) < slotBudget || p.renew(lease, cfg) },
	}
}

// placeStore is what the places policy needs of a place store: *inflight.Reuser is one, and so
// are inflight.Memory and inflight.Redis.
type placeStore interface {
	Wait(ctx context.Context, caps []inflight.Cap, hold time.Duration) (inflight.Result, error)
	Release(ctx context.Context, l inflight.Lease) error
	Renew(ctx context.Context, l inflight.Lease, hold time.Duration) (bool, error)
}

var (
	_ placeStore = (*inflight.Reuser)(nil)
	_ placeStore = (*inflight.Memory)(nil)
)

// caps are the caps a job of tenant must hold a place of; none when the queue has none.
func (p *places) caps(cfg *QueueConfig, tenant string) []inflight.Cap {
	var caps []inflight.Cap
	if cfg.MaxInFlight > 0 {
		caps = append(caps, inflight.Cap{Key: placeKey(p.env.name), Limit: cfg.MaxInFlight})
	}
	if !cfg.Fair || tenant == "" {
		return caps
	}
	limit := cfg.TenantInFlight
	if n, ok := cfg.TenantInFlights[tenant]; ok {
		limit = n // the file's setting for this tenant
	}
	if tc, ok := p.env.control().Tenants[tenant]; ok && tc.InFlight > 0 {
		limit = tc.InFlight // an operator's setting for this tenant
	}
	if limit > 0 {
		caps = append(caps, inflight.Cap{Key: tenantPlaceKey(p.env.name, tenant), Limit: limit})
	}
	return caps
}

// take waits for a place of every cap and returns their lease and when it was asked for, or
// an error: ctx's, or the store's once it has failed for storeGiveUp (counted from the start
// of the first failed call, failedSince), or ErrScheduleDown as soon as the Pool found its
// Redis down.
func (p *places) take(ctx context.Context, caps []inflight.Cap, hold time.Duration) (lease inflight.Lease, acquired time.Time, err error) {
	var (
		b            *retry.Backoff // made at the first failure
		failingSince time.Time
	)
	for {
		start := p.env.now()
		wctx, unbind := p.bind(ctx)
		res, err := p.store.Wait(wctx, caps, hold)
		down := err != nil && context.Cause(wctx) == ErrScheduleDown
		unbind()
		if err == nil {
			p.env.m.placeWait.WithLabelValues(p.env.name).Observe(p.env.now().Sub(start).Seconds())
			return res.Lease, start, nil
		}
		if ctx.Err() != nil {
			return inflight.Lease{}, time.Time{}, ctx.Err()
		}
		if down {
			return inflight.Lease{}, time.Time{}, ErrScheduleDown
		}
		if failingSince.IsZero() {
			failingSince = failedSince(start, p.env.now())
		}
		p.env.m.placeErrors.WithLabelValues(p.env.name).Inc()
		p.env.log.Debug("worker: concurrency places unavailable", "queue", p.env.name, "err", err)
		cross := errors.Is(err, inflight.ErrCrossSlot)
		if cross || p.env.now().Sub(failingSince) >= storeGiveUp || p.health != nil && p.health.err() != nil {
			p.env.log.Warn("worker: cannot take a concurrency place; handing the job back", "queue", p.env.name, "err", err)
			if p.health != nil && !cross {
				p.health.down(p.env.log, failingSince, err)
			}
			return inflight.Lease{}, time.Time{}, err
		}
		if b == nil {
			b = takeBackoff.Backoff(nil)
		}
		if err := b.Wait(ctx, 0); err != nil {
			return inflight.Lease{}, time.Time{}, err
		}
	}
}

// bind is health.bind, or ctx as it is without a health.
func (p *places) bind(ctx context.Context) (context.Context, func()) {
	if p.health == nil {
		return ctx, func() {}
	}
	return p.health.bind(ctx)
}

// release gives a delivery's places back. Should the store fail (Redis stalled or away), it
// tries again in the background until the places' hold has passed, when they come back by
// themselves: a stall costs the cap no longer than the stall and a retry's backoff, not the
// rest of the hold.
func (p *places) release(l inflight.Lease, cfg *QueueConfig) {
	err := p.releaseOnce(l)
	if err == nil {
		return
	}
	p.env.log.Warn("worker: release concurrency places; trying again until their hold ends", "queue", p.env.name, "err", err)
	until := p.env.now().Add(placeHold(cfg))
	go func() {
		b := takeBackoff.Backoff(nil)
		for p.env.now().Before(until) {
			if b.Wait(p.settling, 0) != nil {
				return
			}
			err := p.releaseOnce(l)
			if err == nil {
				return
			}
			p.env.log.Debug("worker: release concurrency places", "queue", p.env.name, "err", err)
		}
	}()
}

// releaseOnce asks the store to give l's places back, once.
func (p *places) releaseOnce(l inflight.Lease) error {
	ctx, cancel := context.WithTimeout(p.settling, storeTimeout)
	defer cancel()
	return p.store.Release(ctx, l)
}

// renew extends l's places for a delivery that starts now, after a slot that came late, and
// reports whether they are still held (when not, they are all given back).
func (p *places) renew(l inflight.Lease, cfg *QueueConfig) bool {
	ctx, cancel := context.WithTimeout(p.settling, storeTimeout)
	defer cancel()
	renewed, err := p.store.Renew(ctx, l, cfg.Timeout+placeMargin)
	if err != nil {
		p.env.log.Warn("worker: renew concurrency places", "queue", p.env.name, "err", err)
	}
	return renewed
}
