package retry

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// MaxRetryAfter caps every wait read from response headers, so a misconfigured or hostile
// server cannot park a client, or pause a whole queue, for days. One hour is longer than any
// per-second or per-minute quota needs and still bounds the damage of an absurd value
// (`Retry-After: 99999999999`); callers whose upstreams have daily quotas may raise it.
// Set it during initialisation: it is read without synchronisation.
var MaxRetryAfter = time.Hour

// Thresholds above which an X-RateLimit-Reset value is a Unix timestamp rather than a delta:
// no service announces a reset more than 31 years away, and 1e12 seconds is year 33658, so
// larger values are epoch milliseconds.
const (
	epochSecondsThreshold = 1e9
	epochMillisThreshold  = 1e12
)

// ParseRetryAfter parses a Retry-After value (RFC 9110 section 10.2.3) relative to now:
// either delay-seconds, a non-negative decimal integer, or an HTTP-date in any of the three
// formats http.ParseTime accepts. A date in the past yields 0, true (retry now). Results are
// capped at [MaxRetryAfter]. Empty, negative, fractional and otherwise malformed values yield
// 0, false: they are never trusted.
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if isDigits(v) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil { // only overflow is possible here: an absurdly large value
			return MaxRetryAfter, true
		}
		return seconds(n), true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return untilCapped(t, now), true
}

// FromHeaders returns how long the server asked the client to wait, reading in order of
// precedence:
//
//  1. Retry-After (see [ParseRetryAfter]);
//  2. the RateLimit field of draft-ietf-httpapi-ratelimit-headers-11: the longest t among the
//     items whose quota is exhausted (r=0) — the wait until every exhausted policy has reset.
//     Items with r > 0 do not block, so a field without an exhausted item gives no wait;
//  3. X-RateLimit-Reset: seconds until the reset, or — when the value exceeds 1e9 — a Unix
//     timestamp in seconds (GitHub's form), or above 1e12 in milliseconds; fractions are
//     allowed.
//
// A malformed field is ignored and the next one is consulted. All results are capped at
// [MaxRetryAfter]; a reset already in the past yields 0, true.
func FromHeaders(h http.Header, now time.Time) (time.Duration, bool) {
	if d, ok := ParseRetryAfter(h.Get("Retry-After"), now); ok {
		return d, true
	}
	var wait time.Duration
	exhausted := false
	for _, l := range ParseRateLimit(h) {
		if l.Remaining == 0 && l.HasReset {
			wait, exhausted = max(wait, l.Reset), true
		}
	}
	if exhausted {
		return wait, true
	}
	return ParseResetHeader(h.Get("X-RateLimit-Reset"), now)
}

// ParseResetHeader parses an X-RateLimit-Reset value relative to now: a non-negative decimal
// number of seconds until the reset, or — above 1e9 — a Unix timestamp in seconds, or — above
// 1e12 — in milliseconds. Past timestamps yield 0, true; results are capped at
// [MaxRetryAfter]; anything else (negative, exponent, units, empty) yields 0, false.
func ParseResetHeader(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	intPart, frac, hasDot := strings.Cut(v, ".")
	if !isDigits(intPart) || hasDot && !isDigits(frac) {
		return 0, false
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, false
	}
	switch {
	case f >= 1e15: // milliseconds past year 33658: absurd, and int64(f) could overflow
		return MaxRetryAfter, true
	case f > epochMillisThreshold:
		return untilCapped(time.UnixMilli(int64(f)), now), true
	case f > epochSecondsThreshold:
		sec := int64(f)
		return untilCapped(time.Unix(sec, int64((f-float64(sec))*1e9)), now), true
	case f >= MaxRetryAfter.Seconds():
		return MaxRetryAfter, true
	}
	return time.Duration(f * float64(time.Second)), true
}

// untilCapped is t-now, floored at 0 and capped at MaxRetryAfter.
func untilCapped(t, now time.Time) time.Duration {
	d := t.Sub(now) // saturates on overflow
	return min(max(d, 0), MaxRetryAfter)
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
