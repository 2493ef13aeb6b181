package worker

import (
	"context"
	"sync"

	"github.com/sluice-rl/sluice/leaky"
)

// Owed charges of a unit budget (cost_from_response), and of each of a queue's budgets.
//
// When an answer reports more than its job was charged and the unit schedule fails the extra
// charge (Reconcile: Redis stalled, unreachable or failing over), the charge is kept here and
// made again after a later delivery of the queue, whose take shows the schedule answers again,
// so that a store's hiccup does not forgive what the upstream counted. A queue with budgets
// (budgets.go) keeps the failed charges of all its budgets in one list, each made again on its
// own budget. The bound: at most maxOwed charges are kept per queue and process (a further one
// is dropped and counted), and each is made at most once more. A kept charge of a state that was lost since (a restart
// without persistence) changes nothing when made: the schedule's epoch check drops it, as the
// budget it was charged against is gone.
//
// Only extra charges are kept. A failed refund is not made again: a refund made twice (the
// first call timed out after Redis had run it, as a stalled server does once it resumes)
// would give the queue units it never got back. A charge made again is made once: the Redis
// schedule marks the takes it charged (leaky.Redis.Reconcile), so a charge whose first call
// ran after all changes nothing the second time. The same policy as the ingress's owed
// charges (package ingress, owed.go), without their double charge.
//
// Kept charges live in the process: a worker that stops with some kept loses them (counted
// in sluice_queue_owed_charges until then).
//
// Metrics: sluice_queue_owed_charges{queue} (kept now, a queue's budgets together) and
// sluice_queue_owed_charges_total{queue,result} (kept, paid, dropped), whose queue label is a
// budget's ("<queue>/<budget>") for a budget's charges.
type owedUnits struct {
	mu     sync.Mutex
	list   []owedUnit
	paying bool // one payer at a time
}

// owedUnit is one extra charge the unit schedule failed: actual units for a job charged c;
// label is the metrics' queue label of its budget (the queue, or "<queue>/<budget>").
type owedUnit struct {
	c      leaky.Charge
	actual int64
	label  string
}

// maxOwed is the most owed charges a queue keeps in one process; payBatch the most one
// payment makes, so that the delivery settling it is not held for long.
const (
	maxOwed  = 4096
	payBatch = 64
)

// keep keeps u to be charged again; false when the bound is full and it was dropped.
func (o *owedUnits) keep(u owedUnit) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.list) >= maxOwed {
		return false
	}
	o.list = append(o.list, u)
	return true
}

// take takes up to payBatch charges to make, unless another payment is under way.
func (o *owedUnits) take() []owedUnit {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.paying || len(o.list) == 0 {
		return nil
	}
	n := min(len(o.list), payBatch)
	batch := append([]owedUnit(nil), o.list[:n]...)
	o.list = append(o.list[:0], o.list[n:]...)
	o.paying = true
	return batch
}

// done ends a payment, putting back the charges it could not make, and returns how many are
// kept now.
func (o *owedUnits) done(back []owedUnit) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.paying = false
	o.list = append(back, o.list...)
	return len(o.list)
}

func (o *owedUnits) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.list)
}

// owe keeps the extra charge of a job charged c whose true cost, actual, the schedule failed
// to reconcile, and reports whether it did; label is the budget's metrics label. A refund
// (actual below the charge) is not kept.
func (u *unitBudget) owe(label string, c leaky.Charge, actual int64) bool {
	if actual <= c.Cost {
		return false
	}
	m, name := u.env.m, u.env.name
	if !u.owed.keep(owedUnit{c: c, actual: actual, label: label}) {
		m.owedCharges.WithLabelValues(label, "dropped").Inc()
		u.env.log.Warn("worker: too many extra unit charges are waiting for the schedule; one is dropped",
			"queue", label, "bound", maxOwed)
		return false
	}
	m.owedCharges.WithLabelValues(label, "kept").Inc()
	m.owed.WithLabelValues(name).Set(float64(u.owed.len()))
	return true
}

// payOwed makes up to payBatch kept charges, each under storeTimeout; it stops at the first
// the schedule fails, keeping it and the rest.
func (u *unitBudget) payOwed() {
	batch := u.owed.take()
	if batch == nil {
		return
	}
	m, name := u.env.m, u.env.name
	for i, o := range batch {
		ctx, cancel := context.WithTimeout(u.settling, storeTimeout)
		err := u.sched.Reconcile(ctx, name, o.c, o.actual)
		cancel()
		if err != nil {
			u.env.log.Debug("worker: make an owed unit charge; kept", "queue", name, "err", err)
			m.owed.WithLabelValues(name).Set(float64(u.owed.done(batch[i:])))
			return
		}
		m.owedCharges.WithLabelValues(o.label, "paid").Inc()
		m.unitsReconciled.WithLabelValues(o.label, "charge").Add(float64(o.actual - o.c.Cost))
	}
	m.owed.WithLabelValues(name).Set(float64(u.owed.done(nil)))
}
