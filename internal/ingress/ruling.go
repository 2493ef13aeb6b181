package ingress

import (
	"math/bits"
	"time"

	"github.com/sluice-rl/sluice/limit"
)

// ruling is what happens to a request and why: the verdict, the rule it defers to, the longest
// Retry-After of the rules it violated (which viol lists), and the policy the rate-limit
// headers report.
type ruling struct {
	action     verdict
	deferTo    *rule
	retryAfter time.Duration
	header     int // index in the charges of the policy the headers report; -1: none
	viol       []*rule
}

// decideRuling turns the decision of each charged rule into the ruling. It is pure: it reads
// its arguments and appends to viol only.
//   - The most restrictive rule decides: a violated rule that rejects makes it reject; else a
//     rule whose store failed and that fails closed makes it fail closed; else a violated
//     rule with on_limit: enqueue, or a matching action: enqueue rule, defers it (mayDefer
//     false — the job API itself — forwards instead); else it is forwarded.
//   - Shadow rules, rules that failed open and allowed requests never restrict.
//   - The headers report the policy that binds (headerPolicy): the rule a request is deferred
//     to, among the violated rules on a 429, else the policy with the smallest share of its
//     limit left; rules without a decision report nothing.
func decideRuling(charges []charge, matched []*rule, mayDefer bool, viol []*rule) ruling {
	rl := ruling{action: forward, header: -1, viol: viol}
	for i := range charges {
		ch := &charges[i]
		ru, d := ch.rule, &ch.dec
		switch src := ch.src; {
		case src == failedClosed:
			if rl.action != reject {
				rl.action = failClosed
			}
		case src == failedOpen || src == notCharged || d.Allowed || ru.shadow:
		case ru.onLimitEnqueue && mayDefer:
			if rl.deferTo == nil {
				rl.deferTo = ru
			}
		default:
			rl.action = reject
			rl.viol = append(rl.viol, ru)
			rl.retryAfter = max(rl.retryAfter, d.RetryAfter)
		}
	}
	if rl.action == forward {
		rl.deferTo = deferTarget(rl.deferTo, matched)
		if rl.deferTo != nil && mayDefer {
			rl.action = deferIt
		}
	}
	rl.header = headerPolicy(charges, &rl, mayDefer)
	return rl
}

// deferTarget is the rule a forwarded request defers to: the first violated on_limit: enqueue
// rule (first), else the first matching action: enqueue rule that is not in shadow mode.
func deferTarget(first *rule, matched []*rule) *rule {
	if first != nil {
		return first
	}
	for _, ru := range matched {
		if ru.actionEnqueue && !ru.shadow {
			return ru
		}
	}
	return nil
}

// headerPolicy returns the index of the charge whose policy the rate-limit headers of ruling
// rl report, or -1: the policy that binds, so that a client can pace on it. That is the rule
// the request is deferred to when it was charged; else, among the violated rules on a 429 and
// among all the rules that decided otherwise, the one with the smallest share of its limit
// left (Remaining/Limit: 59 of 60 requests binds less than 100 of 15 000 tokens), then the
// longest reset.
func headerPolicy(charges []charge, rl *ruling, mayDefer bool) int {
	rejected := rl.action == reject
	best := -1
	for i := range charges {
		ch := &charges[i]
		if ch.src == failedOpen || ch.src == failedClosed || ch.src == notCharged {
			continue
		}
		d, ru := &ch.dec, ch.rule
		if rl.action == deferIt && ru == rl.deferTo {
			return i
		}
		if rejected && (d.Allowed || ru.shadow || ru.onLimitEnqueue && mayDefer) {
			continue
		}
		if best < 0 || binds(d, &charges[best].dec) {
			best = i
		}
	}
	return best
}

// binds reports whether decision a is closer to exhaustion than b: a smaller share of its
// limit left, or the same share and a longer reset. The shares are compared exactly, as
// products of 128 bits.
func binds(a, b *limit.Decision) bool {
	// a.Remaining/a.Limit < b.Remaining/b.Limit, with limits >= 1 and counts >= 0.
	ahi, alo := bits.Mul64(uint64(max(a.Remaining, 0)), uint64(max(b.Limit, 1)))
	bhi, blo := bits.Mul64(uint64(max(b.Remaining, 0)), uint64(max(a.Limit, 1)))
	if ahi != bhi || alo != blo {
		return ahi < bhi || ahi == bhi && alo < blo
	}
	return a.ResetAfter > b.ResetAfter
}

// countDecisions counts each rule's decision under the ruling rl in the decisions metric. The
// rule a request is deferred to is counted as enqueued once the job is stored (deferRequest).
func countDecisions(k *call, rl *ruling) {
	for i := range k.charges {
		ch := &k.charges[i]
		if o, ok := decisionOutcome(ch, rl); ok {
			ch.rule.counters[o].Inc()
		}
	}
	for _, ru := range k.matched {
		if ru.actionEnqueue && !ru.hasLimit && ru.shadow {
			ru.counters[OutcomeShadow].Inc()
		}
	}
}

// decisionOutcome is the outcome counted for charge ch; false when it is counted elsewhere.
func decisionOutcome(ch *charge, rl *ruling) (Outcome, bool) {
	ru, d, src := ch.rule, &ch.dec, ch.src
	deferred := rl.action == deferIt && ru == rl.deferTo
	switch {
	case src == notCharged:
		return 0, false
	case src == failedClosed && ru.shadow, src == failedOpen:
		return OutcomeFailOpen, true
	case src == failedClosed:
		return OutcomeFailClosed, true
	case !d.Allowed && ru.shadow:
		return OutcomeShadow, true
	case !d.Allowed && deferred, ru.actionEnqueue && deferred:
		return 0, false // counted as enqueued once it is
	case !d.Allowed:
		return OutcomeRejected, true
	case src == fromFallback:
		return OutcomeFailOpen, true
	}
	return OutcomeAllowed, true
}
