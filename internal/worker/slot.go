package worker

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/retry"
)

// waitSlot waits until the job may be delivered, with leaky.Wait: it takes a leak slot, sleeps
// until it, and checks that the queue was not paused (nor the schedule's state lost) meanwhile.
// When the schedule cannot be reached it does not deliver: it counts the error and tries again
// after a backoff (takeBackoff), so delivery resumes within a fraction of a second
// of the store's return. The rate is read afresh on every try, so a reload applies at once.
// It returns ctx's error when ctx ends first.
func (r *runner) waitSlot(ctx context.Context) error {
	start := r.p.now()
	failures := 0
	held := func() bool { return r.p.control(r.name).PausedAt(r.p.now()) }
	for {
		// An operator's pause holds every worker: no slot is taken while it lasts.
		for held() {
			if retry.Sleep(ctx, nil, heldPoll) != nil {
				return ctx.Err()
			}
		}
		err := leaky.WaitHooks(ctx, r.p.sched, r.name, r.rate(), leaky.Hooks{
			Held:   held,
			OnSlot: func(late time.Duration) { r.p.m.slotLate.WithLabelValues(r.name).Observe(late.Seconds()) },
			OnGiveUp: func(late time.Duration) {
				r.p.m.givenUp.WithLabelValues(r.name).Inc()
				r.p.log.Debug("worker: slot given up; woke too late to use it on time", "queue", r.name, "late", late)
			},
		})
		if err == nil {
			r.p.m.slotWait.WithLabelValues(r.name).Observe(r.p.now().Sub(start).Seconds())
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, leaky.ErrHeld) {
			continue
		}
		r.p.m.takeErrors.WithLabelValues(r.name).Inc()
		if errors.Is(err, leaky.ErrInvalidRate) {
			// Validated configs never get here; do not spin on one that did.
			r.p.log.Error("worker: invalid rate", "queue", r.name, "err", err)
		} else {
			r.p.log.Debug("worker: leak schedule unavailable", "queue", r.name, "err", err)
		}
		failures++
		if err := retry.Sleep(ctx, nil, takeBackoff.Delay(failures, rand.Float64())); err != nil {
			return err
		}
	}
}

// takeBackoff spaces the retries of a failed slot take: short, so that delivery resumes within a
// fraction of a second of the store's return.
var takeBackoff = retry.Policy{Initial: 10 * time.Millisecond, Max: 200 * time.Millisecond}

// heldPoll is how often a worker looks whether an operator's pause of its queue has ended (the
// controls themselves arrive by a watch, at once).
const heldPoll = 100 * time.Millisecond

// baseRate is the queue's leak rate: the config's, or the one an operator set at run time.
func (r *runner) baseRate() leaky.Rate {
	rate := r.cfg.Load().Rate
	if s := r.p.control(r.name).Rate; s != "" {
		if rt, err := config.ParseRate(s); err == nil && rt.Interval() > 0 {
			rate.Interval = rt.Interval()
		}
	}
	return rate
}

// rate is the leak rate slots are taken at: baseRate, or for an adaptive queue the rate the
// workers learned, when that is lower.
func (r *runner) rate() leaky.Rate {
	rate := r.baseRate()
	if eff := r.learn.rate(); eff > 0 {
		if iv := time.Duration(float64(time.Second) / eff); iv > rate.Interval {
			rate.Interval = iv
		}
	}
	return rate
}
