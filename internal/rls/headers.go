package rls

import (
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/sluice-rl/sluice/internal/httphdr"
	"github.com/sluice-rl/sluice/internal/ingress"
	"github.com/sluice-rl/sluice/limit"
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
//
// RateLimit-Policy and X-RateLimit-Limit depend on the policy and its limit only: they are
// built once and shared (policy.limitHeaders); the others are built per answer.
func headers(items []item, tight int) ([]*corev3.HeaderValue, []byte) {
	it := &items[tight]
	rem := strconv.FormatInt(max(it.dec.Remaining, 0), 10)
	if it.over {
		rem = "0"
	}
	reset := strconv.FormatInt(httphdr.CeilSeconds(it.dec.ResetAfter), 10)
	// The answer's own headers' messages in one allocation, with the two of OVER_LIMIT.
	vs := make([]corev3.HeaderValue, 3, 5)
	if it.over {
		vs = vs[:5]
	}
	set := func(i int, k, v string) *corev3.HeaderValue {
		vs[i].Key, vs[i].Value = k, v
		return &vs[i]
	}
	h := make([]*corev3.HeaderValue, 5, 7)
	h[0], h[2] = it.pol.limitHeaders(it.spec)
	h[1] = set(0, "RateLimit", sfItem(it.pol)+";r="+rem+";t="+reset)
	h[3] = set(1, "X-RateLimit-Remaining", rem)
	h[4] = set(2, "X-RateLimit-Reset", reset)
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
	h = append(h, set(3, "Retry-After", strconv.FormatInt(secs, 10)), set(4, "Content-Type", ingress.ProblemContentType))
	return h, ingress.QuotaBody(violated, secs)
}

// limitHeaders builds the RateLimit-Policy and X-RateLimit-Limit headers of p under spec.
func limitHeaders(p *policy, spec limit.Limit) (policy, lim *corev3.HeaderValue) {
	l := strconv.FormatInt(spec.Limit, 10)
	policy = &corev3.HeaderValue{Key: "RateLimit-Policy", Value: sfItem(p) + ";q=" + l + ";w=" + strconv.FormatInt(httphdr.CeilSeconds(spec.Period), 10)}
	return policy, &corev3.HeaderValue{Key: "X-RateLimit-Limit", Value: l}
}

// sfItem is p's label as a structured-field string.
func sfItem(p *policy) string {
	if p.sfLabel == "" {
		return httphdr.SFString(p.label)
	}
	return p.sfLabel
}
