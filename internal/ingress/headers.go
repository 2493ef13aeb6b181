package ingress

import (
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-rl/sluice/limit"
)

// Header names, in the canonical form net/http stores them in.
const (
	hdrRateLimitPolicy = "Ratelimit-Policy"  // RateLimit-Policy
	hdrRateLimit       = "Ratelimit"         // RateLimit
	hdrXLimit          = "X-Ratelimit-Limit" // X-RateLimit-Limit
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
	// vals holds the header values, each a slice of one: policy, rateLimit, limit,
	// remaining, reset. Set assigns them without allocating, and the capacity of one makes
	// an append elsewhere copy instead of writing into them.
	vals [5]string
	w    *echo.Response // for reapply
}

func newRateHeaders(r *rule, d limit.Decision) *rateHeaders {
	lim := d.Limit
	if lim <= 0 {
		lim = r.spec.Limit
	}
	// One buffer, one string, substrings of it: limit, remaining, reset, then the RateLimit
	// item.
	var buf [96]byte
	b := strconv.AppendInt(buf[:0], lim, 10)
	i1 := len(b)
	b = strconv.AppendInt(b, max(d.Remaining, 0), 10)
	i2 := len(b)
	b = strconv.AppendInt(b, ceilSeconds(d.ResetAfter), 10)
	i3 := len(b)
	b = append(b, r.item...)
	b = append(b, ";r="...)
	b = append(b, b[i1:i2]...)
	b = append(b, ";t="...)
	b = append(b, b[i2:i3]...)
	all := string(b)
	return &rateHeaders{vals: [5]string{r.policy, all[i3:], all[:i1], all[i1:i2], all[i2:i3]}}
}

// apply sets the headers on h, replacing any of the same names (an upstream's own).
func (rh *rateHeaders) apply(h http.Header) {
	h[hdrRateLimitPolicy] = rh.vals[0:1:1]
	h[hdrRateLimit] = rh.vals[1:2:2]
	h[hdrXLimit] = rh.vals[2:3:3]
	h[hdrXRemaining] = rh.vals[3:4:4]
	h[hdrXReset] = rh.vals[4:5:5]
}

// reapply applies the headers to the response they were made for; it is an echo Before hook.
func (rh *rateHeaders) reapply() { rh.apply(rh.w.Header()) }

// retryAfterSeconds is d as a Retry-After delay: whole seconds, rounded up, at least 1.
func retryAfterSeconds(d time.Duration) int64 { return max(ceilSeconds(d), 1) }
