package ingress

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
)

// Budgets.
//
// A rule with budgets (config.Rule.Budgets: input and output tokens, say) is compiled into one
// rule per budget, named "<rule>/<budget>", each with its own limit, cost, key prefix (its
// name, which config keeps distinct from every rule's) and reconciliation; the rule's key,
// match, shadow and store-error mode are theirs too. They share a budgetGroup.
//
// A request passes the rule only when every budget admits it. All budgets are decided in the
// request's one limiter call (one round trip), each charged its own cost; when one refuses,
// the budgets that admitted are refunded at once (refundBudgets), with one more round trip,
// so that a refused request is charged on no budget. This is charge-then-refund, not an
// atomic check: budgets are separate keys, which a Redis Cluster may hold on different
// nodes. What it leaves:
//   - token_bucket, leaky_bucket, gcra: a refund gives back the charge less what the bucket
//     refilled since it was made (limit's Adjust), so a refused request leaves on each other
//     budget at most rate × one round trip of its charge: what that budget would have
//     refilled meanwhile.
//   - fixed_window, sliding_window, sliding_log: the charge is uncounted from the window (or
//     log) it went into; nothing is left.
//   - While the refund is on its way, a concurrent request of the same key sees the charge
//     and may be refused by it: never admitted beyond a limit.
//
// The 429 of a refused request names the budget that refused (the binding one): its
// Retry-After is that budget's (the longest, when several refused), and its RateLimit,
// RateLimit-Policy and violated-policies name "<rule>/<budget>".

// budgetGroup ties together the budgets of one rule; it is compared by identity.
type budgetGroup struct{ rule string }

// compileBudgets compiles the budgets of cr, a rule with budgets, into one rule each.
func compileBudgets(cfg *config.Config, cr config.Rule, queues map[string]*config.Queue) ([]*rule, error) {
	if err := checkName(cr.Name); err != nil {
		return nil, err
	}
	if cr.Action == config.ActionEnqueue || cr.OnLimit == config.OnLimitEnqueue || cr.Concurrency() {
		return nil, errors.New("budgets: a rule with budgets rejects; it neither defers nor caps requests in flight")
	}
	g := &budgetGroup{rule: cr.Name}
	rules := make([]*rule, 0, len(cr.Budgets))
	for _, b := range cr.Budgets {
		if b.Algorithm == config.AlgorithmConcurrency {
			return nil, fmt.Errorf("budget %q: algorithm: concurrency cannot be a unit budget", b.Name)
		}
		br := cr
		br.Budgets, br.Lease = nil, 0
		br.Name = b.FullName(cr.Name)
		br.Algorithm, br.Limit, br.Period, br.Burst = b.Algorithm, b.Limit, b.Period, b.Burst
		br.Cost, br.CostFallback, br.CostFromResponse = b.Cost, b.CostFallback, b.CostFromResponse
		r, err := compileRule(cfg, br, queues)
		if err != nil {
			return nil, fmt.Errorf("budget %q: %w", b.Name, err)
		}
		r.group = g
		rules = append(rules, r)
	}
	return rules, nil
}

// refused reports whether a budget of group g refused the request of k.
func (k *call) refused(g *budgetGroup) bool {
	for i := range k.charges {
		ch := &k.charges[i]
		if ch.rule.group == g && !ch.dec.Allowed && (ch.src == fromStore || ch.src == fromFallback || ch.src == fromCache) {
			return true
		}
	}
	return false
}

// refundBudgets gives back, at once, the charges of budgets that admitted the request of k
// while another budget of the same rule refused it, and marks them not charged: the request
// then passes none of that rule's budgets, and none keeps its charge (see Budgets above). A
// refund the store fails is counted and logged; its charge stands, which errs on the side of
// the limit. It runs under its own deadline (timeout), whether or not the client waits.
func (g *gate) refundBudgets(ctx context.Context, timeout time.Duration, k *call) {
	for i := range k.charges {
		ch := &k.charges[i]
		if ch.rule.group == nil || !ch.dec.Allowed || ch.src != fromStore && ch.src != fromFallback || !k.refused(ch.rule.group) {
			continue
		}
		lim := g.limiter
		if ch.src == fromFallback {
			lim = g.fallback
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		err := lim.Adjust(rctx, ch.req.Key, ch.req.Limit, ch.dec, 0)
		cancel()
		if err != nil {
			g.metrics.storeErrors.Inc()
			g.metrics.budgetRefunds.WithLabelValues(ch.rule.name, "failed").Add(float64(ch.dec.Cost))
			g.log.Debug("ingress: a budget's charge of a request another budget refused could not be given back; it stands",
				"rule", ch.rule.name, "err", err)
		} else {
			g.metrics.budgetRefunds.WithLabelValues(ch.rule.name, "refunded").Add(float64(ch.dec.Cost))
		}
		ch.src = notCharged
	}
}
