package ingress

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-rl/sluice/queue"
)

// respond answers the request under the ruling: 429, 503, or 202 (the deferral), or reports
// true for a request that proceeds, with its headers.
func (g *gate) respond(c echo.Context, rs *ruleSet, k *call, rl *ruling, hdrs *rateHeaders) (bool, *rateHeaders, error) {
	w := c.Response()
	switch rl.action {
	case reject:
		if k.viol[0].conc != nil { // a rule that rejects stops the taking: they are all concurrency rules
			g.writeInFlightExceeded(w, k, hdrs)
		} else {
			g.writeQuotaExceeded(w, k, hdrs, retryAfterSeconds(rl.retryAfter))
		}
		return false, nil, nil
	case failClosed:
		if hdrs != nil {
			hdrs.apply(w.Header())
		}
		writeProblem(w, &Problem{
			Type:       "about:blank",
			Title:      "Rate limiter unavailable",
			Status:     http.StatusServiceUnavailable,
			Detail:     "the rate-limit store cannot be reached and a rule that applies to this request fails closed",
			RetryAfter: retryAfterSeconds(g.cooldown()),
		})
		return false, nil, nil
	case deferIt:
		if hdrs != nil {
			hdrs.apply(w.Header())
		}
		return false, nil, g.deferRequest(c, rs, rl.deferTo)
	}
	if g.noDefer == nil || !g.noDefer(c.Request().URL.Path) {
		if p := limitBody(c.Request(), k.matched, rs.queues); p != nil {
			if hdrs != nil {
				hdrs.apply(w.Header())
			}
			writeProblem(w, p)
			return false, nil, nil
		}
		// Not on the job API's own paths: a submission's key is the client's, scoped there.
		if err := g.scopeIdempotencyKey(rs, k.matched, c.Request()); err != nil {
			if hdrs != nil {
				hdrs.apply(w.Header())
			}
			return false, nil, g.respondError(c, err)
		}
	}
	return true, hdrs, nil
}

// scopeIdempotencyKey rewrites the Idempotency-Key of a request that is forwarded to the key
// its deferral's deliveries carry (queue.UpstreamKey): scoped to its tenant in the queue of the
// first matched rule that defers, when that queue has tenants. A client's request forwarded
// now and, on its retry, deferred so reaches the upstream under one key, and two tenants'
// equal keys under two. It returns the error to answer when the tenant cannot be told (an
// ambiguous tenant header: 400; the id secret not loaded yet: 503), as the deferral would.
func (g *gate) scopeIdempotencyKey(rs *ruleSet, matched []*rule, r *http.Request) error {
	vs := r.Header["Idempotency-Key"]
	if len(vs) == 0 {
		return nil
	}
	for _, ru := range matched {
		if !ru.defers() {
			continue
		}
		q, ok := rs.queues[ru.queue]
		if !ok || len(q.Tenant) == 0 {
			return nil
		}
		tenant, err := g.tenantOf(rs, q, r)
		if err != nil {
			return err
		}
		r.Header["Idempotency-Key"] = []string{queue.UpstreamKey(tenant, vs[0])}
		return nil
	}
	return nil
}

// heldWhole is how much of a body net/http buffers before it must send the header: its
// bufferBeforeChunkingSize. A body up to this size, written before the handler returns, gets
// its Content-Length from net/http.
const heldWhole = 2048

// writeQuotaExceeded answers 429 for the rules in k.viol, with Retry-After and
// X-RateLimit-Retry-After of secs and the quota-exceeded problem. The body of a single rule's
// 429 is assembled from the parts compile made; it is the bytes writeProblem would write.
func (g *gate) writeQuotaExceeded(w http.ResponseWriter, k *call, hdrs *rateHeaders, secs int64) {
	if hdrs == nil { // cannot happen: a rule that rejects has its headers reported
		hdrs = &rateHeaders{vals: [6]string{5: itoa(secs)}}
	}
	h := w.Header()
	if hdrs.vals[0] != "" {
		hdrs.apply(h)
	}
	h[hdrXRetryAfter] = hdrs.vals[5:6:6]
	if len(k.viol) == 1 {
		ru := k.viol[0]
		b := append(k.body[:0], ru.quotaHead...)
		b = strconv.AppendInt(b, secs, 10)
		b = append(b, ru.quotaMid...)
		b = strconv.AppendInt(b, secs, 10)
		b = append(b, '}')
		k.body = b
	} else {
		names := make([]string, len(k.viol))
		for i, ru := range k.viol {
			names[i] = ru.name
		}
		k.body = (&Problem{
			Type:             QuotaExceededType,
			Title:            quotaTitle,
			Status:           http.StatusTooManyRequests,
			Detail:           quotaDetail(names, secs),
			ViolatedPolicies: names,
			RetryAfter:       secs,
		}).appendJSON(k.body[:0])
	}
	// No Content-Length for a body net/http holds whole until the handler returns, as here:
	// it writes the header itself then, without a map entry. That keeps the map at eight
	// entries, the most a map holds in one group; at nine, net/http's map and its copy of it
	// are hash tables, which cost this path several percent (BENCHMARKS.md).
	if len(k.body) > heldWhole {
		hdrs.prob[1] = itoa(int64(len(k.body)))
		h["Content-Length"] = hdrs.prob[1:2:2]
	} else {
		delete(h, "Content-Length")
	}
	setProblemHeaders(h, &hdrs.prob, http.StatusTooManyRequests, hdrs.vals[5])
	w.WriteHeader(http.StatusTooManyRequests)
	w.Write(k.body)
}

func (g *gate) cooldown() time.Duration {
	if g.breaker == nil {
		return time.Second
	}
	return g.breaker.cooldown
}

// quotaDetail is the detail of a 429 for the rules named violated, to be retried in secs.
func quotaDetail(violated []string, secs int64) string {
	if len(violated) == 1 {
		return fmt.Sprintf("rate limit %q exceeded; retry in %d s", violated[0], secs)
	}
	return fmt.Sprintf("rate limits %q exceeded; retry in %d s", violated, secs)
}
