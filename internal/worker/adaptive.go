package worker

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
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
//     after five minutes without a change: a long quiet spell returns the queue to its ceiling;
//   - it survives a schedule that lost its state (a Redis restart without persistence, a
//     failover, a FLUSHALL): each worker's periodic round carries the rate it last learned
//     (plus what the others may have added since) as a target, so a schedule that forgot it
//     starts again from there rather than from the ceiling the upstream pushed back on.
const (
	adaptFactor   = 0.8
	adaptHold     = time.Second
	adaptIncrease = 0.05 // of the ceiling, per second of successes
	adaptForget   = 5 * time.Minute
	adaptEvery    = 250 * time.Millisecond
)

// learner is the policy that learns an adaptive queue's rate (QueueConfig.Adaptive) from its
// deliveries' answers (observe), together with every other worker of the queue, through the
// leak schedule, and reads the shared value every adaptEvery (run). A queue that learns per
// tenant (tenantLearners) leaves it to them. It is safe for concurrent use.
type learner struct {
	env queueEnv
	ad  leaky.Adapter // nil: the schedule cannot adapt, and nothing is learned

	learned   atomic.Uint64 // the learned rate, float64 bits; 0: none yet
	successes atomic.Int64  // 2xx answers since the learned rate was last raised
	changedAt atomic.Int64  // when learned last changed, Unix ns (env.now)
}

// remembered is the target that carries the learned rate through a loss of the schedule's
// state, or 0: the rate last learned, plus the most every worker's rounds may have raised it
// since (a round ago), while it would still be kept (adaptForget) and is below the ceiling.
func (l *learner) remembered(ceiling float64) float64 {
	eff := math.Float64frombits(l.learned.Load())
	changed := time.Unix(0, l.changedAt.Load())
	if eff <= 0 || l.env.now().Sub(changed) >= adaptForget {
		return 0
	}
	if t := eff + 2*adaptIncrease*ceiling*adaptEvery.Seconds(); t < ceiling {
		return t
	}
	return 0
}

// ceiling is the queue's rate in deliveries per second, the learned rate's ceiling.
func (l *learner) ceiling() float64 { return perSecond(baseRate(l.env)) }

// perSecond is rate in deliveries per second; 0 for none.
func perSecond(rate leaky.Rate) float64 {
	if rate.Interval <= 0 {
		return 0
	}
	return float64(time.Second) / float64(rate.Interval)
}

// rate returns the learned rate in deliveries per second, 0 when none is known yet or the
// queue is not adaptive.
func (l *learner) rate() float64 {
	if cfg := l.env.cfg(); !cfg.Adaptive || learnsPerTenant(cfg) {
		return 0
	}
	return math.Float64frombits(l.learned.Load())
}

// adapt applies a change of the queue's learned rate; errors (Redis down) are left to the next
// second's try.
func (l *learner) adapt(change func(a *leaky.Adaptation)) {
	cfg := l.env.cfg()
	if l.ad == nil || !cfg.Adaptive || learnsPerTenant(cfg) {
		return
	}
	ceiling := l.ceiling()
	a := leaky.Adaptation{Ceiling: ceiling, Floor: min(cfg.MinRate, ceiling), Factor: adaptFactor,
		Hold: adaptHold, Forget: adaptForget}
	change(&a)
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	before := math.Float64frombits(l.learned.Load())
	if before <= 0 {
		before = ceiling
	}
	eff, decreased, err := l.ad.Adapt(ctx, l.env.name, a)
	if err != nil {
		l.env.log.Debug("worker: adapt the rate", "queue", l.env.name, "err", err)
		return
	}
	if old := l.learned.Swap(math.Float64bits(eff)); old != math.Float64bits(eff) {
		l.changedAt.Store(l.env.now().UnixNano())
	}
	if decreased {
		l.env.log.Warn("worker: upstream pushed back; effective rate lowered", "queue", l.env.name,
			"from", strconv.FormatFloat(before, 'f', 2, 64), "to", strconv.FormatFloat(eff, 'f', 2, 64))
	}
}

// run refreshes the learned rate every adaptEvery, adding what the successes since earned,
// while ctx lasts and the queue is adaptive.
func (l *learner) run(ctx context.Context) {
	on := func(cfg *QueueConfig) bool { return cfg.Adaptive }
	l.env.every(ctx, adaptEvery, on, nil, func(context.Context) {
		n := float64(l.successes.Swap(0))
		l.adapt(func(a *leaky.Adaptation) {
			eff := math.Float64frombits(l.learned.Load())
			if eff <= 0 {
				eff = a.Ceiling
			}
			a.Increase = adaptIncrease * a.Ceiling * min(1, n/(eff*adaptEvery.Seconds()))
			a.Target = l.remembered(a.Ceiling)
		})
	})
}

// observe feeds one delivery's answer to the learned rate, but for a tenant's job on a queue
// that learns per tenant.
func (l *learner) observe(cfg *QueueConfig, j *job, a answer) {
	if !cfg.Adaptive || learnsPerTenant(cfg) && j.m.Job.Tenant != "" {
		return
	}
	switch a.class {
	case retry.Pause:
		l.adapt(func(a *leaky.Adaptation) { a.Decrease = true })
	case retry.Success:
		l.successes.Add(1)
		if a.resp != nil {
			if target, ok := quotaRate(a.resp.Header, l.env.now()); ok {
				l.adapt(func(a *leaky.Adaptation) { a.Target = max(target, a.Floor) })
			}
		}
	}
}

// quotaRate is the rate that spends the quota the upstream says is left by the time it resets:
// from RateLimit (r and t, the policy with the least left) or X-RateLimit-Remaining and
// X-RateLimit-Reset. false when the answer says neither.
func quotaRate(h http.Header, now time.Time) (float64, bool) {
	best, ok := math.Inf(1), false
	units := retry.Units(h)
	for _, l := range retry.ParseRateLimit(h) {
		if u, named := units[l.Policy]; named && u != "requests" {
			continue // a quota of tokens or bytes says nothing of the request rate
		}
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
