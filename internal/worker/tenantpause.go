package worker

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice/leaky"
)

// A fair queue with pause_scope: tenant pauses the tenant whose job the upstream answered 429
// or 503 (for its Retry-After), not the queue. The pauses live beside the leak schedule
// (leaky.TenantPauses), so every worker of every process holds the tenant back:
//   - its jobs in hand, or fetched while it is paused, are held until the pause's end (handed
//     back with that delay), spending neither an attempt nor a pause retry;
//   - the queue's fair scheduler releases none of its backlog meanwhile (fair.Options.Held),
//     so its jobs do not crowd the delivery stream that the other tenants are served from.
//
// Each process learns the pauses from its own 429s at once (tenantsPaused) and from the
// others' within tenantPoll: in between, a job of a tenant another worker just paused may
// still be sent, and is answered 429 in its turn (a pause retry, no attempt).
//
// A pause is only ever lengthened, never lifted before its end (nothing resumes a tenant), so
// a process keeps every pause it knows until its end, whatever a later read says: a Redis that
// lost its state (a restart without persistence, a failover, a FLUSHALL) cannot let a paused
// tenant's jobs out early. When a read lacks a pause the process knows, it puts it back in the
// store (re-asserts it) for the processes that did not know it, logged once per loss noticed.

// tenantPoll is how often a process rereads the tenant pauses of a queue with pause_scope:
// tenant: one round trip, whose answer holds the tenants paused now only.
const tenantPoll = 100 * time.Millisecond

// tenantPause is the policy of a queue's paused tenants: it holds their jobs before their
// slot (admit), keeps the pauses this process knows current (run), and tells the fair
// scheduler whom to hold back (pausedNow). Safe for concurrent use.
type tenantPause struct {
	env   queueEnv
	store leaky.TenantPauses // nil: the schedule keeps no tenant pauses
	// until maps each tenant paused now, as far as this process knows, to the instant its
	// pause ends on the local clock.
	until atomic.Pointer[map[string]time.Time]
}

// The pool tells it of the pauses its own plans set (Pool.tenantsPaused).
var _ tenantPauseHearer = (*tenantPause)(nil)

// tenantsPaused adds paused, the pauses after one this process set, to the known ones.
func (p *tenantPause) tenantsPaused(now time.Time, paused map[string]time.Duration) {
	p.merge(now, paused)
}

// merge adds paused (time left each, as read at now) to the known pauses, keeping the later
// end of each tenant's, and forgets those that ended by now. It returns the pauses known that
// paused lacks or holds shorter, with the time left of each: those the store lost. The known
// pauses are replaced, never changed in place.
func (p *tenantPause) merge(now time.Time, paused map[string]time.Duration) (lost map[string]time.Duration) {
	old := p.until.Load()
	if len(paused) == 0 && old == nil {
		return nil
	}
	m := make(map[string]time.Time, len(paused))
	for t, d := range paused {
		m[t] = now.Add(d)
	}
	if old != nil {
		for t, end := range *old {
			if !end.After(now) {
				continue
			}
			if got, ok := m[t]; !ok || got.Before(end.Add(-lostSlack)) {
				if lost == nil {
					lost = map[string]time.Duration{}
				}
				lost[t] = end.Sub(now)
			}
			if end.After(m[t]) {
				m[t] = end
			}
		}
	}
	if len(m) == 0 {
		p.until.Store(nil)
	} else {
		p.until.Store(&m)
	}
	return lost
}

// lostSlack is how much shorter than known a pause read from the store may be without counting
// as lost: clocks and round trips move the reading of one pause's end by milliseconds.
const lostSlack = 50 * time.Millisecond

// forget drops every known pause (the queue no longer pauses by tenant).
func (p *tenantPause) forget() {
	if p.until.Load() != nil {
		p.until.Store(nil)
	}
}

// endOf is when tenant's pause ends, as far as this process knows, and whether it is paused at
// now.
func (p *tenantPause) endOf(tenant string, now time.Time) (time.Time, bool) {
	m := p.until.Load()
	if m == nil {
		return time.Time{}, false
	}
	end := (*m)[tenant]
	return end, end.After(now)
}

// pausedNow reports whether tenant is paused now.
func (p *tenantPause) pausedNow(tenant string) bool {
	_, paused := p.endOf(tenant, p.env.now())
	return paused
}

// admit holds a job whose tenant is paused until the pause's end; it comes before the leak
// slot, so a held job takes none.
func (p *tenantPause) admit(_ context.Context, cfg *QueueConfig, j *job) verdict {
	if !cfg.PauseTenant || j.m.Job.Tenant == "" {
		return pass()
	}
	if end, paused := p.endOf(j.m.Job.Tenant, p.env.now()); paused {
		return holdUntil(end, "tenant paused")
	}
	return pass()
}

// run keeps the known pauses current while ctx lasts and the queue pauses by tenant.
func (p *tenantPause) run(ctx context.Context) {
	if p.store == nil {
		return
	}
	on := func(cfg *QueueConfig) bool { return cfg.PauseTenant }
	off := func(context.Context) { p.forget() }
	losing := false // the last read lacked a known pause: logged once per loss
	p.env.every(ctx, tenantPoll, on, off, func(ctx context.Context) {
		pctx, cancel := context.WithTimeout(ctx, storeTimeout)
		defer cancel()
		paused, err := p.store.PausedTenants(pctx, p.env.name)
		if err != nil {
			return
		}
		lost := p.merge(p.env.now(), paused)
		if len(lost) > 0 && !losing {
			p.env.log.Warn("worker: the store lost tenant pauses this process knows (a Redis restart, failover or flush?); holding them to their end and putting them back",
				"queue", p.env.name, "tenants", len(lost))
		}
		losing = len(lost) > 0
		for tenant, left := range lost {
			if _, err := p.store.PauseTenant(pctx, p.env.name, tenant, left); err != nil {
				return // the next read tries again
			}
		}
	})
}
