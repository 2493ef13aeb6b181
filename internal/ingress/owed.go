package ingress

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/limit"
)

// Owed charges.
//
// When an answer reports more than its request was charged and the store fails the extra
// charge (Adjust: Redis down or slow), the charge is kept here and made again after the next
// Adjust that succeeds, so that a store's hiccup does not forgive what a key owes. The bound:
// at most maxOwed charges are kept (a further one is dropped and counted), and each is made at
// most once more.
//
// Only extra charges are kept. A failed refund is not made again: a refund made twice (the
// first call timed out after the store had run it) would give a key more than it paid back.
//
// Exactly once: a charge whose call timed out may still have run, or may run later (a stalled
// Redis runs what it had received when it resumes). Every extra charge carries a random
// limit.Decision.ChargeID from its first call on, and the store records the IDs of the charges
// it made (limit.ChargeMarkTTL, 5 minutes, and the latest limit.MaxChargeMarks a key): whichever
// of the first call and the owed one runs second changes nothing (limit.ErrChargeMade, counted
// as "made"). Owed charges are made payBatch with each Adjust that succeeds once the store
// answers again, so within seconds while requests are reconciled; one made more than 5 minutes
// after the store ran its first call would be charged twice.
//
// Metrics: sluice_rule_owed_charges (kept now) and sluice_rule_owed_charges_total{result} (kept,
// paid, made: its first call had run after all, dropped).
type owedCharges struct {
	mu     sync.Mutex
	list   []owedCharge
	paying bool // one payer at a time
}

// owedCharge is one extra charge the store failed: used units for a decision that charged
// dec.Cost against key under spec.
type owedCharge struct {
	rule string
	key  string
	spec limit.Limit
	dec  limit.Decision
	used int64
}

// maxOwed is the most owed charges a gate keeps.
const maxOwed = 4096

// payBatch is the most owed charges one payment makes, so that a settling request's
// goroutine is not held for long after the store comes back.
const payBatch = 64

// keep keeps c to be charged again; false when the bound is full and it was dropped.
func (o *owedCharges) keep(c owedCharge) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.list) >= maxOwed {
		return false
	}
	o.list = append(o.list, c)
	return true
}

// take takes up to payBatch charges to make, unless another payment is under way.
func (o *owedCharges) take() []owedCharge {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.paying || len(o.list) == 0 {
		return nil
	}
	n := min(len(o.list), payBatch)
	batch := append([]owedCharge(nil), o.list[:n]...)
	o.list = append(o.list[:0], o.list[n:]...)
	o.paying = true
	return batch
}

// done ends a payment, putting back the charges it could not make.
func (o *owedCharges) done(back []owedCharge) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.paying = false
	o.list = append(back, o.list...)
}

func (o *owedCharges) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.list)
}

// owe keeps the extra charge of rc (used units) that the store failed.
func (g *gate) owe(rc reconcile, used int64) {
	if used <= rc.dec.Cost {
		return // a refund: not made again (see owedCharges)
	}
	// rc.dec carries the ChargeID of the failed call (settleCosts): made again, it is made once.
	c := owedCharge{rule: rc.rule.name, key: rc.key, spec: rc.rule.spec, dec: rc.dec, used: used}
	if !g.owed.keep(c) {
		g.metrics.owedCharges.WithLabelValues("dropped").Inc()
		g.log.Warn("ingress: too many extra charges are waiting for the limiter store; one is dropped",
			"rule", rc.rule.name, "bound", maxOwed)
		return
	}
	g.metrics.owedCharges.WithLabelValues("kept").Inc()
	g.metrics.owed.Set(float64(g.owed.len()))
}

// payOwed makes up to payBatch kept charges, each under timeout; it stops at the first the
// store fails, keeping it and the rest. It is called once an Adjust succeeded: the store
// answers again.
func (g *gate) payOwed(timeout time.Duration) {
	batch := g.owed.take()
	if batch == nil {
		return
	}
	for i, c := range batch {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		err := g.limiter.Adjust(ctx, c.key, c.spec, c.dec, c.used)
		cancel()
		if errors.Is(err, limit.ErrDebtCapped) {
			g.metrics.debtCapped.WithLabelValues(c.rule).Inc()
			err = nil
		}
		if errors.Is(err, limit.ErrChargeMade) {
			// The first call ran after all (a stalled store resumed): charged, once.
			g.metrics.owedCharges.WithLabelValues("made").Inc()
			g.metrics.reconciled.WithLabelValues(c.rule, "charge").Add(float64(c.used - c.dec.Cost))
			continue
		}
		if err != nil && isBadInput(err) {
			// The limit changed shape under a reload (a cost now above capacity): the charge
			// cannot be made under its old limit any more.
			g.metrics.owedCharges.WithLabelValues("dropped").Inc()
			continue
		}
		if err != nil {
			g.metrics.storeErrors.Inc()
			g.owed.done(batch[i:])
			g.metrics.owed.Set(float64(g.owed.len()))
			return
		}
		g.metrics.owedCharges.WithLabelValues("paid").Inc()
		g.metrics.reconciled.WithLabelValues(c.rule, "charge").Add(float64(c.used - c.dec.Cost))
	}
	g.owed.done(nil)
	g.metrics.owed.Set(float64(g.owed.len()))
}

// chargeID returns a random limit.Decision.ChargeID, never 0 (which marks nothing).
func chargeID() uint64 {
	for {
		if id := rand.Uint64(); id != 0 {
			return id
		}
	}
}

// isBadInput reports whether err is one of the limit package's errors for bad input, which no
// retry mends.
func isBadInput(err error) bool {
	for _, e := range []error{limit.ErrUnknownAlgorithm, limit.ErrInvalidLimit, limit.ErrInvalidPeriod, limit.ErrInvalidBurst,
		limit.ErrInvalidCost, limit.ErrCostTooHigh, limit.ErrEmptyKey, limit.ErrKeyTooLong, limit.ErrNotAdmitted, limit.ErrOutOfRange} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
