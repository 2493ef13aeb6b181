package ingress

import (
	"net/http"
	"strconv"
	"time"

	"github.com/sluice-rl/sluice/limit"
)

// Header names, in the canonical form net/http stores them in.
const (
	hdrRateLimitPolicy = "Ratelimit-Policy"    // RateLimit-Policy
	hdrRateLimit       = "Ratelimit"           // RateLimit
	hdrXLimit          = "X-Ratelimit-Limit"   // X-RateLimit-Limit
	hdrXRemaining      = "X-Ratelimit-Remaining"
	hdrXReset          = "X-Ratelimit-Reset"
	hdrXRetryAfter     = "X-Ratelimit-Retry-After"
	hdrRetryAfter      = "Retry-After"
)

// rateHeaders are the rate-limit headers of one response, computed once from the policy
// closest to exhaustion (draft-ietf-httpapi-ratelimit-headers-11, and the X-RateLimit-*
// headers GitHub and others send):
//
//	RateLimit-Policy: "orders-per-key";q=10;w=1
//	RateLimit: "orders-per-key";r=3;t=1
//	X-RateLimit-Limit: 10
//	X-RateLimit-Remaining: 3
//	X-RateLimit-Reset: 1
//
// q is the rule's limit and w its period in seconds, rounded up; r is what remains and t the
// seconds until the quota is whole again, rounded up. X-RateLimit-Reset is t too: a delay
// in seconds, not a timestamp.
type rateHeaders struct {
	policy, rateLimit, limit, remaining, reset string
}

func newRateHeaders(r *rule, d limit.Decision) *rateHeaders {
	remaining := strconv.FormatInt(max(d.Remaining, 0), 10)
	reset := strconv.FormatInt(ceilSeconds(d.ResetAfter), 10)
	lim := d.Limit
	if lim <= 0 {
		lim = r.spec.Limit
	}
	return &rateHeaders{
		policy:    r.policy,
		rateLimit: r.item + ";r=" + remaining + ";t=" + reset,
		limit:     strconv.FormatInt(lim, 10),
		remaining: remaining,
		reset:     reset,
	}
}

// apply sets the headers on h, replacing any of the same names (an upstream's own).
func (rh *rateHeaders) apply(h http.Header) {
	h[hdrRateLimitPolicy] = []string{rh.policy}
	h[hdrRateLimit] = []string{rh.rateLimit}
	h[hdrXLimit] = []string{rh.limit}
	h[hdrXRemaining] = []string{rh.remaining}
	h[hdrXReset] = []string{rh.reset}
}

// retryAfterSeconds is d as a Retry-After delay: whole seconds, rounded up, at least 1.
func retryAfterSeconds(d time.Duration) int64 { return max(ceilSeconds(d), 1) }
