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
	// remaining, reset, then X-RateLimit-Retry-After on a 429. apply assigns them without
	// allocating, and the capacity of one makes an append elsewhere copy instead of writing
	// into them.
	vals [6]string
	// prob holds the values of the problem headers of a 429 the gate writes itself.
	prob problemHeaders
	w    *echo.Response // for reapply
}

// newRateHeaders makes the headers that report decision d of rule r. retryAfter, when it
// is not negative, is the delay of a 429 in seconds, for X-RateLimit-Retry-After and
// Retry-After.
func newRateHeaders(r *rule, d limit.Decision, retryAfter int64) *rateHeaders {
	rh := new(rateHeaders)
	// One string for the RateLimit item and the retry delay; remaining, reset and the delay
	// are substrings of it.
	var buf [128]byte
	b := append(buf[:0], r.item...)
	b = append(b, ";r="...)
	i1 := len(b)
	b = strconv.AppendInt(b, max(d.Remaining, 0), 10)
	i2 := len(b)
	b = append(b, ";t="...)
	i3 := len(b)
	b = strconv.AppendInt(b, ceilSeconds(d.ResetAfter), 10)
	i4 := len(b)
	if retryAfter >= 0 {
		b = strconv.AppendInt(b, retryAfter, 10)
	}
	all := string(b)
	lim := r.limitText
	// A decision against another limit says so: a region's part of a global rule's, 0 when
	// that part refused it outright (the only refusal without a limit).
	if d.Limit != r.spec.Limit && (d.Limit > 0 || !d.Allowed && d.RetryAfter > 0) {
		lim = itoa(d.Limit)
	}
	rh.vals = [6]string{r.policy, all[:i4], lim, all[i1:i2], all[i3:i4], all[i4:]}
	return rh
}

// apply sets the headers on h, replacing any of the same names (an upstream's own).
func (rh *rateHeaders) apply(h http.Header) {
	h[hdrRateLimitPolicy] = rh.vals[0:1:1]
	h[hdrRateLimit] = rh.vals[1:2:2]
	h[hdrXLimit] = rh.vals[2:3:3]
	h[hdrXRemaining] = rh.vals[3:4:4]
	if rh.vals[4] != "" {
		h[hdrXReset] = rh.vals[4:5:5]
	} else { // a concurrency policy has no reset: nor may an upstream's stand beside it
		delete(h, hdrXReset)
	}
}

// install applies the headers to w and again just before w's header is written (over an
// upstream's or a handler's own); it is for responses that others write.
func (rh *rateHeaders) install(w *echo.Response) {
	rh.apply(w.Header())
	rh.w = w
	w.Before(rh.reapply)
}

// reapply applies the headers to the response they were made for; it is an echo Before hook.
func (rh *rateHeaders) reapply() { rh.apply(rh.w.Header()) }

// smallInts holds the decimal text of 0 to len-1: most numbers in headers (remaining
// requests, seconds, body lengths) are small, and take no allocation.
var smallInts = func() (t [1024]string) {
	for i := range t {
		t[i] = strconv.Itoa(i)
	}
	return t
}()

// itoa is strconv.FormatInt(n, 10), allocating only for n outside smallInts.
func itoa(n int64) string {
	if n >= 0 && n < int64(len(smallInts)) {
		return smallInts[n]
	}
	return strconv.FormatInt(n, 10)
}

// retryAfterSeconds is d as a Retry-After delay: whole seconds, rounded up, at least 1.
func retryAfterSeconds(d time.Duration) int64 { return max(ceilSeconds(d), 1) }
