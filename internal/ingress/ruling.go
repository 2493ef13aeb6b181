package ingress

import "time"

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
//   - The headers report the policy closest to exhaustion (least remaining, then the longest
//     reset), among the violated rules on a 429; rules without a decision report nothing.
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
	rl.header = headerPolicy(charges, rl.action == reject, mayDefer)
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

// headerPolicy returns the index of the charge whose policy the rate-limit headers report, or
// -1: the one closest to exhaustion among the rules that decided, and among the violated ones
// on a 429.
func headerPolicy(charges []charge, rejected, mayDefer bool) int {
	best := -1
	for i := range charges {
		ch := &charges[i]
		if ch.src == failedOpen || ch.src == failedClosed || ch.src == notCharged {
			continue
		}
		d, ru := &ch.dec, ch.rule
		if rejected && (d.Allowed || ru.shadow || ru.onLimitEnqueue && mayDefer) {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		b := &charges[best].dec
		if d.Remaining < b.Remaining || d.Remaining == b.Remaining && d.ResetAfter > b.ResetAfter {
			best = i
		}
	}
	return best
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
