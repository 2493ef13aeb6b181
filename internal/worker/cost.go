package worker

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/cost"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/limit"
	"github.com/sluice-rl/sluice/queue/fair"
)

// Unit budgets (QueueConfig.Units): a job of a queue with cost_rate waits for one slot of
// both the request rate and its units (leaky.WaitCost), charged its estimate (Job.Cost). With
// CostFromResponse, the answer's true cost is reconciled on the unit schedule: the difference
// is charged or refunded (leaky.CostSchedule.Reconcile), so that the schedule follows what
// the upstream counts.
//
// A refund only helps the jobs not yet holding a slot: slots reserved after the refunded
// job's stay where they are (a max-plus recurrence cannot move them). So a unit queue reserves
// units at most unitAhead before they come, one job per process at a time (unitBudget.turn), and a
// job told to wait longer asks again every unitPoll, so that a refund reconciled meanwhile
// brings its units forward. Without it, the estimates of every job waiting with a slot
// would stand, whatever their true costs.
const (
	unitAhead = 20 * time.Millisecond
	unitPoll  = 20 * time.Millisecond
	// maxCostBody is how much of an answer's body is read for cost_from_response: json.
	maxCostBody = 1 << 20
	// maxStreamAnswer is how much of a streamed answer is read for its usage events: read as
	// it arrives and not kept (cost.Stream), so only the delivery's time bounds it otherwise.
	maxStreamAnswer = 256 << 20
)

// unitBudget is the policy of a queue's unit budget (cost_rate): a job waits for one slot
// of both the request rate and its units (admit), and its answer's true cost is reconciled
// (observe). Safe for concurrent use.
type unitBudget struct {
	env   queueEnv
	sched leaky.CostSchedule // nil: the schedule keeps no unit budgets, and none applies
	// bsched is sched's named budgets (budgets.go); nil: it keeps none.
	bsched leaky.BudgetSchedule
	// slot is the queue's leak slot, whose wait this one shares; learned lowers the units an
	// adaptive queue asks for (unitLearner).
	slot    *leakSlot
	learned *unitLearner
	// fraction is the region's part of a global queue's budgets (regionalLease.fraction): the
	// units asked for are lowered to it. Nil: 1.
	fraction func() float64
	// turn is held by the one job of the runner taking its slot and units.
	turn chan struct{}
	// mean is the mean cost of the jobs charged lately (math.Float64bits; 0: none yet),
	// weighted costWeight to the last: a global queue's demand in units (regionalLease.demand).
	mean atomic.Uint64
	// settling bounds reconciliations: it ends a grace after shutdown.
	settling context.Context
	// owed are the extra charges the schedule failed, to be made again (owed.go).
	owed owedUnits
	// fairs has the layout of a fair queue, whose scheduler hears the reconciled costs of a
	// queue with fair_by: units (fair.ReportCost); nil: none is told.
	fairs fairSource
}

func newUnitBudget(env queueEnv, sched leaky.Schedule, slot *leakSlot, learned *unitLearner, fraction func() float64, settling context.Context) *unitBudget {
	cs, _ := sched.(leaky.CostSchedule)
	bs, _ := sched.(leaky.BudgetSchedule)
	return &unitBudget{env: env, sched: cs, bsched: bs, slot: slot, learned: learned, fraction: fraction,
		turn: make(chan struct{}, 1), settling: settling}
}

// admit waits for the job's slot and units together (leaky.WaitCost), one job of the queue at
// a time in this process, and records the charge on the job (job.charged: the leak slot
// policy then lets it go at once). A queue without units, or a schedule that keeps none, goes
// on to the plain slot.
func (u *unitBudget) admit(ctx context.Context, cfg *QueueConfig, j *job) verdict {
	j.charged, j.charges = false, nil
	if len(cfg.Budgets) > 0 {
		return u.admitBudgets(ctx, cfg, j)
	}
	if cfg.Units.IsZero() || u.sched == nil {
		return pass()
	}
	err := u.slot.wait(ctx, cfg, j, func(ctx context.Context, h leaky.Hooks) error {
		select {
		case u.turn <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		defer func() { <-u.turn }()
		c, err := leaky.WaitCost(ctx, u.sched, u.env.name, u.slot.rate(), u.ask(cfg, j), h)
		if err == nil {
			j.charge, j.charged = c, true
			u.charged(c.Cost)
		}
		return err
	})
	if err != nil {
		return refuse(endNotSent, err.Error())
	}
	return pass()
}

// costWeight is the weight of the last job's cost in the mean cost (unitBudget.mean): about
// the last 1/costWeight jobs count.
const costWeight = 0.1

// charged adds a job's charge to the mean cost; called with turn held, so by one job at a time.
func (u *unitBudget) charged(cost int64) {
	m := math.Float64frombits(u.mean.Load())
	if m == 0 {
		m = float64(cost)
	} else {
		m += costWeight * (float64(cost) - m)
	}
	u.mean.Store(math.Float64bits(m))
}

// meanCost is the mean cost of the jobs charged lately, 0 before the first.
func (u *unitBudget) meanCost() float64 { return math.Float64frombits(u.mean.Load()) }

// ask is what job j asks of cfg's unit budget — for a global queue, the region's fraction of
// it, or the learned unit rate when lower: its cost (0 means 1), capped at what the
// budget can deliver at once — a larger cost cannot have been accepted under this config
// (the config changed since), and is charged the capacity, never blocking the queue.
func (u *unitBudget) ask(cfg *QueueConfig, j *job) leaky.Ask {
	c := max(j.m.Job.Cost, 1)
	if cfg.CostCapacity > 0 && c > cfg.CostCapacity {
		u.env.logger(j).Warn("worker: job costs more than the queue's cost_rate and cost_burst can deliver; charging the capacity",
			"cost", c, "capacity", cfg.CostCapacity)
		c = cfg.CostCapacity
	}
	units := cfg.Units
	if u.fraction != nil {
		units = regionalUnits(units, u.fraction()) // a global queue: the region's share of cost_rate
	}
	if cfg.Adaptive { // the learned rate, when lower
		units = u.learned.units(units, u.env.now())
	}
	return leaky.Ask{Units: units, Cost: c, Ahead: unitAhead, Poll: unitPoll}
}

// observe reads the true cost of j's delivery from its answer (cfg.CostFromResponse) and
// charges or refunds the difference from its charge; it counts the units delivered either
// way. A missing or malformed true cost leaves the estimate standing. An extra charge the
// schedule fails is kept and made after a later delivery's (owed.go); a failed refund is not.
func (u *unitBudget) observe(cfg *QueueConfig, j *job, a answer) {
	if len(cfg.Budgets) > 0 {
		u.observeBudgets(cfg, j, a)
		return
	}
	if !j.charged {
		return
	}
	// The job's take succeeded: the schedule answered lately, so the charges it failed
	// before are made now (owed.go), after this job's own.
	defer u.payOwed()
	m, name := u.env.m, u.env.name
	units := j.charge.Cost
	defer func() { m.unitsDelivered.WithLabelValues(name).Add(float64(units)) }()
	if !cfg.CostFromResponse.IsSet() || a.resp == nil {
		return
	}
	var (
		actual int64
		ok     bool
	)
	if a.stream != nil {
		actual, ok = a.stream.Cost(cfg.CostFromResponse, a.resp.Header)
	} else {
		actual, ok = cost.FromResponse(cfg.CostFromResponse, a.resp.Header, a.body)
	}
	if !ok {
		m.unreconciled.WithLabelValues(name).Inc()
		u.env.log.Debug("worker: no true cost in the answer; the estimate stands", "queue", name,
			"job", j.m.Job.ID, "cost_from_response", cfg.CostFromResponse.String(), "status", a.resp.StatusCode)
		return
	}
	if actual == j.charge.Cost {
		return
	}
	// What the answer owes above the charge is paid in full (the unit schedule moves on by
	// it), up to the cap every debt has: limit.DebtCapacities of the budget's capacity.
	if most := j.charge.Cost + limit.DebtCapacities*max(cfg.Units.N, cfg.Units.Burst); actual > most {
		actual = most
		m.debtCapped.WithLabelValues(name).Inc()
	}
	ctx, cancel := context.WithTimeout(u.settling, storeTimeout)
	defer cancel()
	if err := u.sched.Reconcile(ctx, name, j.charge, actual); err != nil {
		m.unreconciled.WithLabelValues(name).Inc()
		u.env.log.Debug("worker: reconcile the true cost; an extra charge is kept, a refund dropped", "queue", name, "err", err)
		if u.owe(name, j.charge, actual) {
			units = actual // charged later
		}
		return
	}
	units = actual
	if d := actual - j.charge.Cost; d > 0 {
		m.unitsReconciled.WithLabelValues(name, "charge").Add(float64(d))
	} else {
		m.unitsReconciled.WithLabelValues(name, "refund").Add(float64(-d))
	}
	u.reportFair(cfg, j, actual)
}

// reportFair tells the scheduler of a fair queue with fair_by: units the true cost of j's
// delivery, actual, which it counted at the job's Job.Cost (fair.ReportCost): tenants then
// share the true units by weight. A report that fails is dropped (the job stays counted at its
// estimate).
func (u *unitBudget) reportFair(cfg *QueueConfig, j *job, actual int64) {
	if !cfg.Fair || !cfg.FairByUnits || u.fairs == nil {
		return
	}
	l, err := u.fairs.FairLayout(u.env.name)
	if err == nil {
		err = fair.ReportCost(l, j.m.Job.Tenant, actual-max(j.m.Job.Cost, 1))
	}
	if err != nil {
		u.env.log.Debug("worker: report a reconciled cost to the fair scheduler; dropped", "queue", u.env.name, "err", err)
	}
}

// readsCostBody reports whether deliveries of cfg keep the answer's body: cost_from_response
// (the queue's, or a budget's) reads a JSON pointer in it.
func readsCostBody(cfg *QueueConfig) bool {
	if cfg.Units.IsZero() && len(cfg.Budgets) == 0 {
		return false
	}
	for _, c := range responseCosts(cfg) {
		if c.Reads(func(k config.CostKind) bool { return k == config.CostJSON }) {
			return true
		}
	}
	return false
}

// readCostBody reads up to maxCostBody of resp's body; or, when the answer is streamed
// (cost.IsStream), all of it (up to maxStreamAnswer) through a cost.Stream that reads its usage
// events and keeps none of it. A stream that ended in an error (reset, timeout) is cut: st is
// nil then, and the charge stands.
func readCostBody(cfg *QueueConfig, resp *http.Response) (body []byte, st *cost.Stream, err error) {
	if ok, sse := cost.IsStream(resp.Header.Get("Content-Type")); ok {
		s := cost.NewStream(sse, responseCosts(cfg)...)
		if _, err = io.Copy(streamWriter{s}, io.LimitReader(resp.Body, maxStreamAnswer)); err != nil {
			return nil, nil, err
		}
		s.End()
		return nil, s, nil
	}
	var b bytes.Buffer
	_, err = b.ReadFrom(io.LimitReader(resp.Body, maxCostBody))
	return b.Bytes(), nil, err
}

// streamWriter feeds a cost.Stream as an io.Writer.
type streamWriter struct{ s *cost.Stream }

func (w streamWriter) Write(p []byte) (int, error) {
	w.s.Write(p)
	return len(p), nil
}

// unitReset is how long until an upstream's exhausted token budget comes back, from an answer
// that says it is exhausted: X-RateLimit-Remaining-Tokens 0 with X-RateLimit-Reset-Tokens (a
// Go-like duration: 6m0s, 1s, 20ms), or anthropic-ratelimit-tokens-remaining 0 with
// anthropic-ratelimit-tokens-reset (RFC 3339). false when it says neither.
func unitReset(h http.Header, now time.Time) (time.Duration, bool) {
	for _, q := range tokensLeft(h, now) {
		if q.left == 0 {
			return min(q.reset, maxUnitReset), true
		}
	}
	return 0, false
}

// tokenQuota is what one provider's headers say of its token budget: tokens left, and how
// long until they reset (> 0).
type tokenQuota struct {
	left  int64
	reset time.Duration
}

// tokensLeft reads the token budgets an answer reports: X-RateLimit-Remaining-Tokens with
// X-RateLimit-Reset-Tokens (a Go-like duration: 6m0s, 1s, 20ms), and
// anthropic-ratelimit-tokens-remaining with anthropic-ratelimit-tokens-reset (RFC 3339).
func tokensLeft(h http.Header, now time.Time) []tokenQuota {
	var out []tokenQuota
	if n, err := strconv.ParseInt(strings.TrimSpace(h.Get("X-Ratelimit-Remaining-Tokens")), 10, 64); err == nil && n >= 0 {
		if d, err := time.ParseDuration(strings.TrimSpace(h.Get("X-Ratelimit-Reset-Tokens"))); err == nil && d > 0 {
			out = append(out, tokenQuota{n, d})
		}
	}
	if n, err := strconv.ParseInt(strings.TrimSpace(h.Get("Anthropic-Ratelimit-Tokens-Remaining")), 10, 64); err == nil && n >= 0 {
		if t, err := time.Parse(time.RFC3339, strings.TrimSpace(h.Get("Anthropic-Ratelimit-Tokens-Reset"))); err == nil && t.After(now) {
			out = append(out, tokenQuota{n, t.Sub(now)})
		}
	}
	return out
}

// maxUnitReset bounds the pause a unit reset asks for, as a wrong clock or header must not
// stop a queue for days.
const maxUnitReset = time.Hour
