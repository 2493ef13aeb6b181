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
	item := it.pol.sfLabel
	if item == "" {
		item = httphdr.SFString(it.pol.label)
	}
	rem := strconv.FormatInt(max(it.dec.Remaining, 0), 10)
	if it.over {
		rem = "0"
	}
	reset := strconv.FormatInt(httphdr.CeilSeconds(it.dec.ResetAfter), 10)
	lim := strconv.FormatInt(it.spec.Limit, 10)
	// The headers' messages in one allocation, room for the two of OVER_LIMIT included.
	vs := make([]corev3.HeaderValue, 7)
	set := func(i int, k, v string) *corev3.HeaderValue {
		vs[i].Key, vs[i].Value = k, v
		return &vs[i]
	}
	h := make([]*corev3.HeaderValue, 5, 7)
	h[0] = set(0, "RateLimit-Policy", item+";q="+lim+";w="+strconv.FormatInt(httphdr.CeilSeconds(it.spec.Period), 10))
	h[1] = set(1, "RateLimit", item+";r="+rem+";t="+reset)
	h[2] = set(2, "X-RateLimit-Limit", lim)
	h[3] = set(3, "X-RateLimit-Remaining", rem)
	h[4] = set(4, "X-RateLimit-Reset", reset)
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
	h = append(h, set(5, "Retry-After", strconv.FormatInt(secs, 10)), set(6, "Content-Type", ingress.ProblemContentType))
	return h, ingress.QuotaBody(violated, secs)
}
