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
//   - its jobs in hand, or fetched while it is paused, are not sent but handed back with a
//     delay to the pause's end (endHeld), spending neither an attempt nor a pause retry;
//   - the queue's fair scheduler releases none of its backlog meanwhile (fair.Options.Held),
//     so its jobs do not crowd the delivery stream that the other tenants are served from.
//
// Each process learns the pauses from its own 429s at once and from the others' within
// tenantPoll: in between, a job of a tenant another worker just paused may still be sent, and
// is answered 429 in its turn (a pause retry, no attempt).

// tenantPoll is how often a process rereads the tenant pauses of a queue with pause_scope:
// tenant: one round trip, whose answer holds the tenants paused now only.
const tenantPoll = 100 * time.Millisecond

// tenantHolds are the tenants of one queue paused now, as far as this process knows: tenant →
// the instant its pause ends on the local clock. Safe for concurrent use.
type tenantHolds struct {
	until atomic.Pointer[map[string]time.Time]
}

// set replaces the known pauses by paused (time left each, as read at now).
func (h *tenantHolds) set(now time.Time, paused map[string]time.Duration) {
	if len(paused) == 0 {
		if h.until.Load() != nil {
			h.until.Store(nil)
		}
		return
	}
	m := make(map[string]time.Time, len(paused))
	for t, d := range paused {
		m[t] = now.Add(d)
	}
	h.until.Store(&m)
}

// heldFor is how long tenant stays paused after now; 0 when it is not.
func (h *tenantHolds) heldFor(tenant string, now time.Time) time.Duration {
	m := h.until.Load()
	if m == nil {
		return 0
	}
	return max((*m)[tenant].Sub(now), 0)
}

// tenantPauses returns the Pool's schedule as TenantPauses, or nil when it keeps none.
func (p *Pool) tenantPauses() leaky.TenantPauses {
	tp, _ := p.sched.(leaky.TenantPauses)
	return tp
}

// tenantLoop keeps r.holds current while ctx lasts and the queue pauses by tenant.
func (r *runner) tenantLoop(ctx context.Context) {
	tp := r.p.tenantPauses()
	if tp == nil {
		return
	}
	t := time.NewTicker(tenantPoll)
	defer t.Stop()
	for {
		if !r.cfg.Load().PauseTenant {
			r.holds.set(r.p.now(), nil)
			if !r.untilChanged(ctx) {
				return
			}
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, storeTimeout)
		paused, err := tp.PausedTenants(pctx, r.name)
		cancel()
		if err == nil {
			r.holds.set(r.p.now(), paused)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// admitTenant ends the pass of a job whose tenant is paused, to come back at the pause's end
// (endHeld); it runs before the leak slot, so a held job takes none.
func (r *runner) admitTenant(_ context.Context, cfg *QueueConfig, j *job) (func(), passEnd, bool) {
	if !cfg.PauseTenant || j.m.Job.Tenant == "" {
		return nil, 0, false
	}
	if d := r.holds.heldFor(j.m.Job.Tenant, r.p.now()); d > 0 {
		j.heldFor = d
		return nil, endHeld, true
	}
	return nil, 0, false
}
