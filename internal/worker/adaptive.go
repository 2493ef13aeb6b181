package worker

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/retry"
)

// Adaptive drain (QueueConfig.Adaptive): the queue's rate is a ceiling, and the workers learn
// what the upstream takes, together, through the leak schedule (leaky.Adapter):
//
//   - a 429 or 503 lowers the learned rate to 80% (once per second however many workers see
//     it; the pause the answer asks for still applies), and is logged;
//   - 2xx answers raise it by 5% of the ceiling per second of successful deliveries, a
//     twentieth of that within 15% of where the upstream last pushed back, so that the rate
//     lingers below the upstream's capacity instead of running into its next 429;
//   - a 2xx that says how much quota is left (RateLimit r and t, or X-RateLimit-Remaining and
//     -Reset) lowers it to what finishes that quota by the reset, instead of running into a 429;
//   - every worker reads the shared value four times a second, so all take slots at it (a
//     worker still on an older, faster value would bunch its slots among the others');
//   - the value survives worker restarts (it is in the schedule's state) and is forgotten
//     after five minutes without a change: a long quiet spell returns the queue to its ceiling.
const (
	adaptFactor   = 0.8
	adaptHold     = time.Second
	adaptIncrease = 0.05 // of the ceiling, per second of successes
	adaptForget   = 5 * time.Minute
	adaptEvery    = 250 * time.Millisecond
)

// learnedRate returns the learned rate in deliveries per second, 0 when none is known yet.
func (r *runner) learnedRate() float64 { return math.Float64frombits(r.learned.Load()) }

// adapt applies a change of the queue's learned rate; errors (Redis down) are left to the next
// second's try.
func (r *runner) adapt(change func(a *leaky.Adaptation)) {
	ad, ok := r.p.sched.(leaky.Adapter)
	cfg := r.cfg.Load()
	if !ok || !cfg.Adaptive {
		return
	}
	ceiling := r.ceiling()
	a := leaky.Adaptation{Ceiling: ceiling, Floor: min(cfg.MinRate, ceiling), Factor: adaptFactor,
		Hold: adaptHold, Forget: adaptForget}
	change(&a)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	before := r.learnedRate()
	if before <= 0 {
		before = ceiling
	}
	eff, decreased, err := ad.Adapt(ctx, r.name, a)
	if err != nil {
		r.p.log.Debug("worker: adapt the rate", "queue", r.name, "err", err)
		return
	}
	r.learned.Store(math.Float64bits(eff))
	if decreased {
		r.p.log.Warn("worker: upstream pushed back; effective rate lowered", "queue", r.name,
			"from", strconv.FormatFloat(before, 'f', 2, 64), "to", strconv.FormatFloat(eff, 'f', 2, 64))
	}
}

// ceiling is the queue's rate in deliveries per second: the config's or an operator's.
func (r *runner) ceiling() float64 {
	base := r.baseRate()
	if base.Interval <= 0 {
		return 0
	}
	return float64(time.Second) / float64(base.Interval)
}

// learnLoop refreshes the learned rate once a second, adding what the successes of that second
// earned, until ctx ends.
func (r *runner) learnLoop(ctx context.Context) {
	t := time.NewTicker(adaptEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !r.cfg.Load().Adaptive {
			continue
		}
		n := float64(r.successes.Swap(0))
		r.adapt(func(a *leaky.Adaptation) {
			eff := r.learnedRate()
			if eff <= 0 {
				eff = a.Ceiling
			}
			a.Increase = adaptIncrease * a.Ceiling * min(1, n/(eff*adaptEvery.Seconds()))
		})
	}
}

// observe feeds one delivery's answer to the learned rate.
func (r *runner) observe(class retry.Class, resp *http.Response) {
	if !r.cfg.Load().Adaptive {
		return
	}
	switch class {
	case retry.Pause:
		r.adapt(func(a *leaky.Adaptation) { a.Decrease = true })
	case retry.Success:
		r.successes.Add(1)
		if resp != nil {
			if target, ok := quotaRate(resp.Header, r.p.now()); ok {
				r.adapt(func(a *leaky.Adaptation) { a.Target = max(target, a.Floor) })
			}
		}
	}
}

// quotaRate is the rate that spends the quota the upstream says is left by the time it resets:
// from RateLimit (r and t, the policy with the least left) or X-RateLimit-Remaining and
// X-RateLimit-Reset. false when the answer says neither.
func quotaRate(h http.Header, now time.Time) (float64, bool) {
	best, ok := math.Inf(1), false
	for _, l := range retry.ParseRateLimit(h) {
		if l.HasReset && l.Reset > 0 {
			best, ok = min(best, float64(l.Remaining)/l.Reset.Seconds()), true
		}
	}
	if ok {
		return best, true
	}
	rem := strings.TrimSpace(h.Get("X-RateLimit-Remaining"))
	if rem == "" {
		return 0, false
	}
	n, err := strconv.ParseInt(rem, 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	reset, ok := retry.ParseResetHeader(h.Get("X-RateLimit-Reset"), now)
	if !ok || reset <= 0 {
		return 0, false
	}
	return float64(n) / reset.Seconds(), true
}
