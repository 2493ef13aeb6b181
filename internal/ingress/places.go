package ingress

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-rl/sluice/inflight"
	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/limit"
)

// Concurrency rules (algorithm: concurrency, nginx limit_conn): at most limit requests of a key
// forwarded to the upstream at once. A request takes a place of each such rule it matches after
// the rate rules have let it through (a request they reject or defer takes none), in rule
// order, one Acquire per rule; the first refusal ends the taking, and a request that is not
// forwarded after all (refused, deferred, failed closed, its body too large, its client gone)
// gives back what it took before it is answered. A forwarded request holds its places until its
// answer is finished — the body copied, the client gone, the upstream failed, or the rule's
// timeout passed, when the forwarding is cut off — and gives them back on its own goroutine
// (Server.forwardHolding, with a defer: a panic of the proxy gives them back too). Each place is
// held for the rule's timeout plus holdMargin, so a place whose ingress died comes back by
// itself then, never while its request may still be at the upstream.

// holdMargin is what a place outlives the timeout of its request by: the time from taking the
// place to starting the request, and from the request's deadline to its end.
const holdMargin = time.Second

// releaseFloor is the least time a release of a shared place is given: a release that fails
// leaves the place taken until its hold ends, so it may wait longer than a decision.
const releaseFloor = 250 * time.Millisecond

// concurrency is the cap of an algorithm: concurrency rule.
type concurrency struct {
	limit   int64
	timeout time.Duration // the longest a forwarded request may take
	hold    time.Duration // timeout + holdMargin: how long a place is held at most
}

// compileConcurrency sets the cap of an algorithm: concurrency rule.
func (r *rule) compileConcurrency(cr config.Rule) error {
	switch {
	case r.actionEnqueue:
		return fmt.Errorf("algorithm %s caps forwarded requests; action: enqueue forwards none", config.AlgorithmConcurrency)
	case cr.Limit < 1:
		return fmt.Errorf("limit must be >= 1 requests in flight, got %d", cr.Limit)
	case cr.Timeout < 0:
		return fmt.Errorf("timeout must be > 0, got %v", cr.Timeout)
	}
	timeout := cr.TimeoutOrDefault()
	r.conc = &concurrency{limit: cr.Limit, timeout: timeout, hold: timeout + holdMargin}
	r.rejects = nil // a full cap frees up at any moment: nothing to remember
	return nil
}

// place is one concurrency place a forwarded request holds, with the store that gave it.
type place struct {
	store inflight.Store
	lease inflight.Lease
}

// held are the places of one request, kept by the request's handler (on its stack) from the
// gate's check until its answer is finished.
type held struct {
	n       int
	first   [2]place
	more    []place
	timeout time.Duration // the shortest timeout of the rules whose places are held
	release time.Duration // how long a release of a shared place may take

	recon []reconcile // charges to reconcile with the answer's true cost (reconcile.go)
}

func (h *held) add(p place, timeout time.Duration) {
	if h.n < len(h.first) {
		h.first[h.n] = p
	} else {
		h.more = append(h.more, p)
	}
	if h.n == 0 || timeout < h.timeout {
		h.timeout = timeout
	}
	h.n++
}

func (h *held) at(i int) *place {
	if i < len(h.first) {
		return &h.first[i]
	}
	return &h.more[i-len(h.first)]
}

// release gives back every place of h, and empties it. A place that cannot be given back (the
// store failed) is logged and comes back when its hold ends.
func (g *gate) release(h *held) {
	for i := range h.n {
		p := h.at(i)
		ctx, cancel := context.Background(), context.CancelFunc(nil)
		if _, local := p.store.(*inflight.Memory); !local {
			ctx, cancel = context.WithTimeout(ctx, h.release)
		}
		if err := p.store.Release(ctx, p.lease); err != nil {
			g.metrics.storeErrors.Inc()
			g.log.Warn("ingress: a concurrency place could not be given back; it comes back when its hold ends", "err", err)
		}
		if cancel != nil {
			cancel()
		}
	}
	*h = held{}
}

// takePlaces takes a place of every concurrency rule of k (k.conc), in rule order, into h, and
// sets each charge's decision and source. It stops at the first rule that refuses (one not in
// shadow mode) or fails closed, leaving the rest notCharged; what it took stays in h for the
// caller to keep or release. It returns an error only when ctx ended (the client went away).
func (g *gate) takePlaces(ctx context.Context, rs *ruleSet, k *call, h *held) error {
	h.release = max(rs.storeTimeout, releaseFloor)
	stop := false
	for i := range k.conc {
		ch := &k.conc[i]
		if stop {
			ch.src = notCharged
			continue
		}
		ru := ch.rule
		k.caps[0] = inflight.Cap{Key: ch.req.Key, Limit: ru.conc.limit}
		res, store, src, err := g.acquire(ctx, rs, ru, k.caps[:])
		if err != nil {
			return err
		}
		ch.src = src
		if src == failedOpen || src == failedClosed {
			stop = src == failedClosed
			continue
		}
		ch.dec = limit.Decision{Allowed: res.Acquired, Limit: ru.conc.limit}
		if len(res.InFlight) == 1 {
			ch.dec.Remaining = max(ru.conc.limit-res.InFlight[0], 0)
		}
		if res.Acquired {
			h.add(place{store: store, lease: res.Lease}, ru.conc.timeout)
			continue
		}
		stop = !ru.shadow
	}
	return nil
}

// acquire takes a place of caps for rule ru: from the gate's store, under store_timeout and the
// circuit breaker when it is shared; when that fails, from the in-process fallback for a rule
// that fails open (each ingress then caps the key on its own), or not at all for one that
// fails closed. It returns the store the place came from and the source of the decision, and
// an error only when ctx ended.
func (g *gate) acquire(ctx context.Context, rs *ruleSet, ru *rule, caps []inflight.Cap) (inflight.Result, inflight.Store, source, error) {
	hold := ru.conc.hold
	if g.placesFallback == nil { // in-process: fails only on bad input, which compile rules out
		res, err := g.places.Acquire(ctx, caps, hold)
		if err != nil {
			g.log.Error("ingress: concurrency places", "err", err)
			g.metrics.storeErrors.Inc()
			return res, nil, storeFailure(ru), nil
		}
		return res, g.places, fromStore, nil
	}
	ok, probe := true, false
	if g.breaker != nil {
		ok, probe = g.breaker.allow()
	}
	if ok {
		tctx, cancel := context.WithTimeout(ctx, rs.storeTimeout)
		res, err := g.places.Acquire(tctx, caps, hold)
		cancel()
		if err == nil {
			if g.breaker != nil {
				g.breaker.done(probe, succeeded)
			}
			return res, g.places, fromStore, nil
		}
		if ctx.Err() != nil {
			if g.breaker != nil {
				g.breaker.abandon(probe)
			}
			return inflight.Result{}, nil, 0, ctx.Err()
		}
		if g.breaker != nil {
			g.breaker.done(probe, classifyStoreError(err))
		}
		g.metrics.storeErrors.Inc()
	}
	if src := storeFailure(ru); src == failedClosed {
		return inflight.Result{}, nil, src, nil
	}
	res, err := g.placesFallback.Acquire(ctx, caps, hold)
	if err != nil {
		return res, nil, failedOpen, nil
	}
	return res, g.placesFallback, fromFallback, nil
}

// inFlightPolicy is the RateLimit-Policy of a concurrency rule: its name, its limit as q, and the
// draft's quota unit for requests in flight, with no window: `"conns";q=4;qu="concurrent-requests"`.
func inFlightPolicy(item string, lim int64) string {
	return item + ";q=" + strconv.FormatInt(lim, 10) + `;qu="concurrent-requests"`
}

// newInFlightHeaders makes the headers that report decision d of concurrency rule r:
//
//	RateLimit-Policy: "conns";q=4;qu="concurrent-requests"
//	RateLimit: "conns";r=0
//	X-RateLimit-Limit: 4
//	X-RateLimit-Remaining: 0
//
// r is the places left after this request took its own; there is no reset time (a place
// frees when a request finishes) and no Retry-After.
func newInFlightHeaders(r *rule, d limit.Decision) *rateHeaders {
	rh := new(rateHeaders)
	rem := itoa(max(d.Remaining, 0))
	rh.vals = [6]string{r.policy, r.item + ";r=" + rem, r.limitText, rem, "", ""}
	return rh
}

// inFlightTitle is the title of a 429 for a concurrency rule.
const inFlightTitle = "Too many requests in flight"

// writeInFlightExceeded answers 429 for the concurrency rules in k.viol: the quota-exceeded
// problem, with the rate-limit headers of hdrs, and no Retry-After — a place frees when one of
// the key's requests in flight finishes, which the ingress cannot foresee; the longest it can
// take is the rule's timeout, too long to be a useful hint.
func (g *gate) writeInFlightExceeded(w http.ResponseWriter, k *call, hdrs *rateHeaders) {
	names := make([]string, len(k.viol))
	for i, ru := range k.viol {
		names[i] = ru.name
	}
	detail := fmt.Sprintf("concurrency limit %q reached: %d requests of this key are in flight; retry when one has finished", names[0], k.viol[0].conc.limit)
	if len(names) > 1 {
		detail = fmt.Sprintf("concurrency limits %q reached; retry when a request of this key has finished", names)
	}
	if hdrs != nil {
		hdrs.apply(w.Header())
	}
	delete(w.Header(), hdrXRetryAfter)
	writeProblem(w, &Problem{
		Type:             QuotaExceededType,
		Title:            inFlightTitle,
		Status:           http.StatusTooManyRequests,
		Detail:           detail,
		ViolatedPolicies: names,
	})
}

// forwardHolding forwards the request of c while it holds the places of h: the forwarding is
// cut off after the shortest timeout of their rules, and the places are given back once it
// has returned, whatever way (a defer: the proxy's ErrAbortHandler panic included).
func (s *Server) forwardHolding(c echo.Context, hdrs *rateHeaders, body *bodyReader, h *held) error {
	defer s.gate.release(h)
	r := c.Request()
	ctx, cancel := context.WithTimeout(r.Context(), h.timeout)
	defer cancel()
	c.SetRequest(r.WithContext(ctx))
	if len(h.recon) > 0 {
		return s.forwardReconciling(c, hdrs, body, h)
	}
	return s.forward(c, hdrs, body)
}
