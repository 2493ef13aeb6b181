package client

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/retry"
)

// RateLimitState is what the most recent response carrying rate-limit headers said about the
// caller's quota, for the policy closest to exhaustion.
//
// It is read from the IETF fields of draft-ietf-httpapi-ratelimit-headers-11 —
// `RateLimit: "orders-per-key";r=3;t=1` and `RateLimit-Policy: "orders-per-key";q=10;w=1` —
// and, when the response has no valid RateLimit field, from X-RateLimit-Limit,
// X-RateLimit-Remaining and X-RateLimit-Reset. Malformed fields are ignored.
type RateLimitState struct {
	// Policy is the name of the policy (empty with X-RateLimit-* headers).
	Policy string
	// Limit is the quota per window (q, or X-RateLimit-Limit); -1 when the response did not
	// say.
	Limit int64
	// Remaining is the quota left in the current window (r, or X-RateLimit-Remaining); -1
	// when the response did not say.
	Remaining int64
	// Reset is the time from Observed until the quota resets (t, or X-RateLimit-Reset); zero
	// when the response did not say.
	Reset time.Duration
	// Window is the policy's window (w); zero when unknown.
	Window time.Duration
	// Observed is when the response was received (on the client's clock). It is the zero
	// time when no response has carried rate-limit headers yet.
	Observed time.Time
}

// RateLimit returns the rate-limit state of the most recent response that carried
// rate-limit headers; responses without them leave it unchanged. It is safe to call
// concurrently with requests in flight, and with several goroutines sharing the client,
// "most recent" is the last response to arrive.
func (c *Client) RateLimit() RateLimitState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rl
}

func (c *Client) observe(h http.Header, now time.Time) {
	st, ok := parseRateLimitState(h, now)
	if !ok {
		return
	}
	c.mu.Lock()
	c.rl = st
	c.mu.Unlock()
}

func parseRateLimitState(h http.Header, now time.Time) (RateLimitState, bool) {
	st := RateLimitState{Limit: -1, Remaining: -1, Observed: now}
	if limits := retry.ParseRateLimit(h); len(limits) > 0 {
		// The policy closest to exhaustion: least remaining, then the longest reset.
		pick := limits[0]
		for _, l := range limits[1:] {
			if l.Remaining < pick.Remaining || l.Remaining == pick.Remaining && l.Reset > pick.Reset {
				pick = l
			}
		}
		st.Policy, st.Remaining, st.Reset = pick.Policy, pick.Remaining, pick.Reset
		for _, q := range retry.ParseRateLimitPolicy(h) {
			if q.Policy == pick.Policy {
				st.Limit, st.Window = q.Quota, q.Window
			}
		}
		return st, true
	}

	limit, okLimit := nonNegativeInt(h.Get("X-RateLimit-Limit"))
	remaining, okRemaining := nonNegativeInt(h.Get("X-RateLimit-Remaining"))
	reset, okReset := retry.ParseResetHeader(h.Get("X-RateLimit-Reset"), now)
	if !okLimit && !okRemaining && !okReset {
		return RateLimitState{}, false
	}
	if okLimit {
		st.Limit = limit
	}
	if okRemaining {
		st.Remaining = remaining
	}
	st.Reset = reset
	return st, true
}

func nonNegativeInt(v string) (int64, bool) {
	v = strings.TrimSpace(v)
	if v == "" || v[0] == '-' || v[0] == '+' {
		return 0, false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil
}
