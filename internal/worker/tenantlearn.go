package worker

import (
	"context"
	"math"
	"sync"
	"sync/atomic"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/retry"
)

// An adaptive fair queue with pause_scope: tenant learns a rate for each tenant instead of one
// for the queue: an upstream that limits each API key on its own pushes back on one tenant
// while the others go on. Each tenant's learned rate follows the queue's rules (adaptive.go),
// bounded by the tenant's cap (its own rate, or tenant_rate) and the queue's rate, and is kept
// beside the leak schedule under "<queue>/t/<tenant>", shared by every worker. The fair
// scheduler spaces the tenant's jobs at it (fair.Options.TenantRates).
//
// State grows with the tenants that had deliveries lately: a worker keeps ~100 bytes per
// tenant it delivered for in the last adaptForget, and Redis one small hash per tenant whose
// rate changed within adaptForget; both are forgotten after that long idle, and the tenant is
// back at its cap.

// tenantLearners is the policy of the learned rates of one queue's tenants: it learns from
// their answers (observe) and raises and forgets them (run); the fair scheduler reads them
// (rates, version). It is safe for concurrent use.
type tenantLearners struct {
	env queueEnv
	ad  leaky.Adapter // nil: the schedule cannot adapt, and nothing is learned
	mu  sync.Mutex
	m   map[string]*tenantLearner
	// version counts the changes of any learned rate, for the scheduler to follow.
	version atomic.Uint64
}

// tenantLearner is one tenant's learned rate, as this worker last read it.
type tenantLearner struct {
	learned   atomic.Uint64 // float64 bits; 0: none yet
	successes atomic.Int64  // 2xx answers since the last raise
	seen      atomic.Int64  // Unix ns of its last delivery's answer
}

// learnsPerTenant reports whether the queue of cfg learns a rate per tenant.
func learnsPerTenant(cfg *QueueConfig) bool { return cfg.Adaptive && cfg.PauseTenant }

func (ts *tenantLearners) get(tenant string) *tenantLearner {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.m == nil {
		ts.m = map[string]*tenantLearner{}
	}
	l := ts.m[tenant]
	if l == nil {
		l = &tenantLearner{}
		ts.m[tenant] = l
	}
	return l
}

// ceiling is tenant's cap: its own rate (an operator's, else the file's), else the queue's
// tenant_rate, within the queue's rate.
func (ts *tenantLearners) ceiling(cfg *QueueConfig, tenant string) float64 {
	c := perSecond(baseRate(ts.env))
	if tc, ok := ts.env.control().Tenants[tenant]; ok && tc.Rate != "" {
		if rt, err := config.ParseRate(tc.Rate); err == nil && rt.PerSecond() > 0 {
			return min(c, rt.PerSecond())
		}
	}
	if r, ok := cfg.TenantRates[tenant]; ok {
		return min(c, r)
	}
	if cfg.TenantRate > 0 {
		return min(c, cfg.TenantRate)
	}
	return c
}

// adapt applies change to tenant's learned rate.
func (ts *tenantLearners) adapt(tenant string, l *tenantLearner, change func(a *leaky.Adaptation)) {
	cfg := ts.env.cfg()
	if ts.ad == nil || !learnsPerTenant(cfg) {
		return
	}
	ceiling := ts.ceiling(cfg, tenant)
	if ceiling <= 0 {
		return
	}
	a := leaky.Adaptation{Ceiling: ceiling, Floor: min(cfg.MinRate, ceiling), Factor: adaptFactor,
		Hold: adaptHold, Forget: adaptForget}
	change(&a)
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	eff, decreased, err := ts.ad.Adapt(ctx, ts.env.name+"/t/"+tenant, a)
	if err != nil {
		ts.env.log.Debug("worker: adapt a tenant's rate", "queue", ts.env.name, "err", err)
		return
	}
	if old := l.learned.Swap(math.Float64bits(eff)); old != math.Float64bits(eff) {
		ts.version.Add(1)
	}
	if decreased {
		ts.env.log.Info("worker: upstream pushed back on a tenant; its rate lowered", "queue", ts.env.name,
			"tenant", tenant, "to", eff)
	}
}

// observe feeds one delivery's answer to its tenant's learned rate, on a queue that learns
// per tenant.
func (ts *tenantLearners) observe(cfg *QueueConfig, j *job, a answer) {
	tenant := j.m.Job.Tenant
	if !learnsPerTenant(cfg) || tenant == "" {
		return
	}
	l := ts.get(tenant)
	l.seen.Store(ts.env.now().UnixNano())
	resp := a.resp
	switch a.class {
	case retry.Pause:
		ts.adapt(tenant, l, func(a *leaky.Adaptation) { a.Decrease = true })
	case retry.Success:
		l.successes.Add(1)
		if resp != nil {
			if target, ok := quotaRate(resp.Header, ts.env.now()); ok {
				ts.adapt(tenant, l, func(a *leaky.Adaptation) { a.Target = max(target, a.Floor) })
			}
		}
	}
}

// rates returns the tenants' learned rates, for the scheduler.
func (ts *tenantLearners) rates() map[string]float64 {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	out := make(map[string]float64, len(ts.m))
	for t, l := range ts.m {
		if eff := math.Float64frombits(l.learned.Load()); eff > 0 {
			out[t] = eff
		}
	}
	return out
}

// run raises the tenants' rates by what their successes earned every adaptEvery, and forgets
// tenants idle for adaptForget, while ctx lasts and the queue learns per tenant.
func (ts *tenantLearners) run(ctx context.Context) {
	ts.env.every(ctx, adaptEvery, learnsPerTenant, nil, func(context.Context) { ts.raise() })
}

// raise is one of run's rounds.
func (ts *tenantLearners) raise() {
	ts.mu.Lock()
	type due struct {
		tenant string
		l      *tenantLearner
		n      float64
	}
	var raise []due
	idle := ts.env.now().Add(-adaptForget).UnixNano()
	for tenant, l := range ts.m {
		if l.seen.Load() < idle {
			delete(ts.m, tenant)
			ts.version.Add(1)
			continue
		}
		if n := l.successes.Swap(0); n > 0 {
			raise = append(raise, due{tenant, l, float64(n)})
		}
	}
	ts.mu.Unlock()
	for _, d := range raise {
		ts.adapt(d.tenant, d.l, func(a *leaky.Adaptation) {
			eff := math.Float64frombits(d.l.learned.Load())
			if eff <= 0 {
				eff = a.Ceiling
			}
			a.Increase = adaptIncrease * a.Ceiling * min(1, d.n/(eff*adaptEvery.Seconds()))
		})
	}
}
