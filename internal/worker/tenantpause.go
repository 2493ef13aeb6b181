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

// tenantsPaused replaces the known pauses by paused (time left each, as read at now).
func (p *tenantPause) tenantsPaused(now time.Time, paused map[string]time.Duration) {
	if len(paused) == 0 {
		if p.until.Load() != nil {
			p.until.Store(nil)
		}
		return
	}
	m := make(map[string]time.Time, len(paused))
	for t, d := range paused {
		m[t] = now.Add(d)
	}
	p.until.Store(&m)
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
	off := func(context.Context) { p.tenantsPaused(p.env.now(), nil) }
	p.env.every(ctx, tenantPoll, on, off, func(ctx context.Context) {
		pctx, cancel := context.WithTimeout(ctx, storeTimeout)
		paused, err := p.store.PausedTenants(pctx, p.env.name)
		cancel()
		if err == nil {
			p.tenantsPaused(p.env.now(), paused)
		}
	})
}
