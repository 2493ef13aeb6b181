package ingress

import "github.com/sluice-rl/sluice/limit"

// cutToRegion decides ch, a charge of a global rule, against the region's part of its limit
// now (Options.RegionalLimit); when that part admits nothing, or not the request's cost, ch is
// refused without the limiter (fromRegion) until the region may hold more.
func (g *gate) cutToRegion(ch *charge) {
	spec, wait, ok := g.regional(ch.rule.name, ch.req.Limit)
	if !ok || ch.req.Cost > spec.Capacity() {
		ch.dec, ch.src = limit.Decision{Limit: spec.Limit, RetryAfter: wait, ResetAfter: wait}, fromRegion
		return
	}
	ch.req.Limit = spec
}

// regionRejection decides the request of k without the limiter when the region's share of a
// global rule that rejects (not shadow, not on_limit: enqueue) refused it: the request is
// rejected whatever the store would say, so, as with a cached rejection, the other rules are
// not charged (notCharged). It reports whether it decided.
func regionRejection(k *call) bool {
	hit := false
	for i := range k.charges {
		ch := &k.charges[i]
		if ru := ch.rule; ch.src == fromRegion && !ru.shadow && !ru.onLimitEnqueue {
			hit = true
		}
	}
	if !hit {
		return false
	}
	for i := range k.charges {
		if ch := &k.charges[i]; charged(ch) {
			ch.src = notCharged
		}
	}
	return true
}
