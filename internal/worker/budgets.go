package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/cost"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/limit"
)

// Budgets (QueueConfig.Budgets): a queue with several named unit budgets (input and output
// tokens) delivers a job once the request rate and every budget have room for it: one slot
// for all of them (leaky.WaitCosts, one round trip), each budget charged the job's cost on it
// (Job.Costs, read at acceptance) on its own schedule. Each budget's true cost is then read
// from the answer with its own pointer and reconciled on that budget alone, as a queue's one
// unit budget is (cost.go): the same unitAhead and unitPoll, the same debt cap. The binding
// budget spaces the jobs; the others are charged at the same slots, so none goes over its
// own rate. Metrics name a budget's queue label "<queue>/<budget>".

// Budget is one of a queue's named unit budgets (config.Queue.Budgets).
type Budget struct {
	// Name names the budget within its queue: its schedule and its metrics' queue label
	// ("<queue>/<name>").
	Name string
	// Units is the budget's units per period and burst; Capacity caps a job's charge on it
	// (config.QueueBudget.Capacity; 0: no cap).
	Units    leaky.Units
	Capacity int64
	// CostFromResponse reads the budget's true cost from a delivery's answer; the zero Cost
	// reads none.
	CostFromResponse config.Cost
}

// budgetsFromConfig maps a queue's config budgets to the worker's.
func budgetsFromConfig(bs []config.QueueBudget) []Budget {
	var out []Budget
	for _, b := range bs {
		out = append(out, Budget{Name: b.Name, Units: leaky.Units{N: b.CostRate.N, Per: b.CostRate.Per, Burst: b.CostBurst},
			Capacity: b.Capacity(), CostFromResponse: b.CostFromResponse})
	}
	return out
}

// validateBudgets reports what makes c's budgets unusable.
func (c QueueConfig) validateBudgets() []error {
	if len(c.Budgets) == 0 {
		return nil
	}
	var errs []error
	if !c.Units.IsZero() {
		errs = append(errs, errors.New("a queue with budgets has no unit budget of its own"))
	}
	seen := map[string]bool{}
	for _, b := range c.Budgets {
		if b.Name == "" || seen[b.Name] {
			errs = append(errs, fmt.Errorf("budget %q: empty or named twice", b.Name))
		}
		seen[b.Name] = true
		if u := b.Units; u.N <= 0 || u.Per < time.Microsecond || u.Burst < 0 {
			errs = append(errs, fmt.Errorf("budget %q: units %v must have N > 0, a period of at least 1µs and burst >= 0", b.Name, u))
		}
	}
	return errs
}

// budgetsKept reports a queue with budgets whose schedule keeps none (not a
// leaky.BudgetSchedule): its budgets would not apply, so it is not run.
func (c QueueConfig) budgetsKept(sched leaky.Schedule) error {
	if _, ok := sched.(leaky.BudgetSchedule); ok || len(c.Budgets) == 0 {
		return nil
	}
	return fmt.Errorf("worker: queue %q: its budgets need a schedule that keeps them (leaky.BudgetSchedule: Redis or Memory)", c.Name)
}

// admitBudgets is admit for a queue with budgets: it waits for the job's slot and its units on
// every budget together (leaky.WaitCosts), one job of the queue at a time in this process,
// and records the charges on the job.
func (u *unitBudget) admitBudgets(ctx context.Context, cfg *QueueConfig, j *job) verdict {
	if u.bsched == nil {
		return pass()
	}
	err := u.slot.wait(ctx, cfg, j, func(ctx context.Context, h leaky.Hooks) error {
		select {
		case u.turn <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		defer func() { <-u.turn }()
		cs, err := leaky.WaitCosts(ctx, u.bsched, u.env.name, u.slot.rate(), u.asks(cfg, j), h)
		if err == nil {
			j.charges, j.charged = cs, true
		}
		return err
	})
	if err != nil {
		return refuse(endNotSent, err.Error())
	}
	return pass()
}

// asks is what job j asks of each of cfg's budgets: its cost on it (Job.Costs; missing or 0
// means 1), capped at the budget's capacity as ask caps the queue's.
func (u *unitBudget) asks(cfg *QueueConfig, j *job) []leaky.Ask {
	asks := make([]leaky.Ask, len(cfg.Budgets))
	for i, b := range cfg.Budgets {
		c := int64(1)
		if i < len(j.m.Job.Costs) {
			c = max(j.m.Job.Costs[i], 1)
		}
		if b.Capacity > 0 && c > b.Capacity {
			u.env.logger(j).Warn("worker: job costs more than a budget can deliver; charging the capacity",
				"budget", b.Name, "cost", c, "capacity", b.Capacity)
			c = b.Capacity
		}
		asks[i] = leaky.Ask{Units: b.Units, Cost: c, Ahead: unitAhead, Poll: unitPoll, Budget: b.Name}
	}
	return asks
}

// observeBudgets is observe for a queue with budgets: each budget's true cost is read from the
// answer with its own pointer and reconciled on that budget; the units delivered are counted
// per budget either way. An extra charge a budget's schedule fails is kept and made after a
// later delivery's, as the queue's one unit budget's is (owed.go); a failed refund is not.
func (u *unitBudget) observeBudgets(cfg *QueueConfig, j *job, a answer) {
	if !j.charged || len(j.charges) != len(cfg.Budgets) {
		return
	}
	// The job's take succeeded: the schedule answered lately, so the charges it failed
	// before are made now (owed.go), after this job's own.
	defer u.payOwed()
	for i, b := range cfg.Budgets {
		u.reconcileBudget(b, j, j.charges[i], a)
	}
}

// reconcileBudget reconciles charge c of budget b for j's answer a.
func (u *unitBudget) reconcileBudget(b Budget, j *job, c leaky.Charge, a answer) {
	m, name := u.env.m, u.env.name+"/"+b.Name
	units := c.Cost
	defer func() { m.unitsDelivered.WithLabelValues(name).Add(float64(units)) }()
	if !b.CostFromResponse.IsSet() || a.resp == nil {
		return
	}
	var (
		actual int64
		ok     bool
	)
	if a.stream != nil {
		actual, ok = a.stream.Cost(b.CostFromResponse, a.resp.Header)
	} else {
		actual, ok = cost.FromResponse(b.CostFromResponse, a.resp.Header, a.body)
	}
	if !ok {
		m.unreconciled.WithLabelValues(name).Inc()
		return
	}
	if actual == c.Cost {
		return
	}
	if most := c.Cost + limit.DebtCapacities*max(b.Units.N, b.Units.Burst); actual > most {
		actual = most
		m.debtCapped.WithLabelValues(name).Inc()
	}
	ctx, cancel := context.WithTimeout(u.settling, storeTimeout)
	defer cancel()
	if err := u.bsched.Reconcile(ctx, u.env.name, c, actual); err != nil {
		m.unreconciled.WithLabelValues(name).Inc()
		u.env.log.Debug("worker: reconcile a budget's true cost; an extra charge is kept, a refund dropped",
			"queue", u.env.name, "budget", b.Name, "err", err)
		if u.owe(name, c, actual) {
			units = actual // charged later
		}
		return
	}
	units = actual
	if d := actual - c.Cost; d > 0 {
		m.unitsReconciled.WithLabelValues(name, "charge").Add(float64(d))
	} else {
		m.unitsReconciled.WithLabelValues(name, "refund").Add(float64(-d))
	}
}

// responseCosts are the pointers the answers of cfg's deliveries are read with: the queue's
// own cost_from_response, or each budget's.
func responseCosts(cfg *QueueConfig) []config.Cost {
	if len(cfg.Budgets) == 0 {
		return []config.Cost{cfg.CostFromResponse}
	}
	out := make([]config.Cost, 0, len(cfg.Budgets))
	for _, b := range cfg.Budgets {
		if b.CostFromResponse.IsSet() {
			out = append(out, b.CostFromResponse)
		}
	}
	return out
}
