package rls

import (
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/sluice-rl/sluice/internal/httphdr"
	"github.com/sluice-rl/sluice/internal/ingress"
)

// headers are the response headers the HTTP path sends, for the descriptor closest to
// exhaustion (items[tight]), and on OVER_LIMIT the problem+json body of a 429:
//
//	RateLimit-Policy: "orders-per-key";q=10;w=60
//	RateLimit: "orders-per-key";r=0;t=42
//	X-RateLimit-Limit: 10
//	X-RateLimit-Remaining: 0
//	X-RateLimit-Reset: 42
//	Retry-After: 42                           (OVER_LIMIT only)
//	Content-Type: application/problem+json    (OVER_LIMIT only)
func headers(items []item, tight int) ([]*corev3.HeaderValue, []byte) {
	it := &items[tight]
	item := httphdr.SFString(it.pol.label)
	rem := strconv.FormatInt(max(it.dec.Remaining, 0), 10)
	if it.over {
		rem = "0"
	}
	reset := strconv.FormatInt(httphdr.CeilSeconds(it.dec.ResetAfter), 10)
	lim := strconv.FormatInt(it.spec.Limit, 10)
	h := []*corev3.HeaderValue{
		hv("RateLimit-Policy", item+";q="+lim+";w="+strconv.FormatInt(httphdr.CeilSeconds(it.spec.Period), 10)),
		hv("RateLimit", item+";r="+rem+";t="+reset),
		hv("X-RateLimit-Limit", lim),
		hv("X-RateLimit-Remaining", rem),
		hv("X-RateLimit-Reset", reset),
	}
	if !it.over {
		return h, nil
	}
	secs := max(httphdr.CeilSeconds(it.dec.RetryAfter), 1)
	var violated []string
	for i := range items {
		if items[i].over {
			violated = append(violated, items[i].pol.label)
		}
	}
	h = append(h, hv("Retry-After", strconv.FormatInt(secs, 10)), hv("Content-Type", ingress.ProblemContentType))
	return h, ingress.QuotaBody(violated, secs)
}
