package ingress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/sluice-rl/sluice/limit"
)

// decide fills in the decision and source of every charge of k. It returns an error only
// when ctx ended (the client went away); a failing store is handled here, rule by rule.
func (g *gate) decide(ctx context.Context, rs *ruleSet, k *call) error {
	start := time.Now()
	defer func() { g.metrics.duration.Observe(time.Since(start).Seconds()) }()

	if regionRejection(k) {
		return nil
	}

	if g.breaker == nil {
		reqs := k.collect(charged)
		if len(reqs) == 0 {
			return nil
		}
		decs, err := ask(ctx, g.limiter, reqs, &k.one)
		if err == nil {
			k.settle(decs, fromStore)
			return nil
		}
		// An in-process limiter fails only on bad input, which compile rules out.
		g.log.Error("ingress: limiter", "err", err)
		g.metrics.storeErrors.Inc()
		k.failAll()
		return nil
	}

	if g.cachedRejection(k) {
		return nil
	}
	if ok, probe := g.breaker.allow(); ok {
		err := g.storeDecisions(ctx, rs.storeTimeout, k)
		if err == nil {
			g.breaker.done(probe, succeeded)
			g.rememberRejections(k)
			return nil
		}
		if ctx.Err() != nil {
			g.breaker.abandon(probe)
			return ctx.Err()
		}
		g.breaker.done(probe, classifyStoreError(err))
		g.metrics.storeErrors.Inc()
	}

	// The store failed or the breaker is open: rules that fail open are decided in-process.
	k.failAll()
	reqs := k.collect(func(ch *charge) bool { return ch.src == failedOpen })
	if len(reqs) == 0 {
		return nil
	}
	decs, err := ask(ctx, g.fallback, reqs, &k.one)
	if err != nil {
		g.log.Error("ingress: fallback limiter", "err", err)
		return nil // those rules stay failedOpen: allowed without a decision
	}
	k.settle(decs, fromFallback)
	return nil
}

// settle records decs, the limiter's answer to k.reqs, as the decisions of the charges in
// k.idx, decided from src.
func (k *call) settle(decs []limit.Decision, src source) {
	for j, i := range k.idx {
		ch := &k.charges[i]
		ch.dec, ch.src = decs[j], src
	}
}

// failAll marks every charge of k left to the store as left without a decision by it.
func (k *call) failAll() {
	for i := range k.charges {
		ch := &k.charges[i]
		if !charged(ch) {
			continue
		}
		ch.dec, ch.src = limit.Decision{}, storeFailure(ch.rule)
	}
}

// ask decides reqs with lim: with Decide when there is one request (the common case, which
// needs no slice; its decision goes to one), else with DecideAll.
func ask(ctx context.Context, lim limit.Limiter, reqs []limit.Request, one *[1]limit.Decision) ([]limit.Decision, error) {
	if len(reqs) == 1 {
		q := &reqs[0]
		d, err := lim.Decide(ctx, q.Key, q.Limit, q.Cost)
		if err != nil {
			return nil, err
		}
		one[0] = d
		return one[:], nil
	}
	return lim.DecideAll(ctx, reqs)
}

// classifyStoreError tells a timeout (which a slow process sees too) from a hard failure of the
// store, for the breaker.
func classifyStoreError(err error) outcome {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return timedOut
	}
	return failedHard
}

// askStore asks the remote limiter for reqs under a context that ends after timeout. The
// limiter returns once that context ends (Options.Limiter), so this is the whole bound; the
// call runs on the request's goroutine, and nothing of it outlives the request.
func (g *gate) askStore(ctx context.Context, timeout time.Duration, k *call) ([]limit.Decision, error) {
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	decs, err := ask(tctx, g.limiter, k.reqs, &k.one)
	switch {
	case err != nil:
		return nil, fmt.Errorf("ingress: limiter store: %w", err)
	case len(decs) != len(k.reqs):
		return nil, fmt.Errorf("ingress: limiter store returned %d decisions for %d requests", len(decs), len(k.reqs))
	}
	return decs, nil
}

// storeFailure is what a rule without a decision does.
func storeFailure(ru *rule) source {
	if ru.failOpen || ru.shadow {
		return failedOpen
	}
	return failedClosed
}
