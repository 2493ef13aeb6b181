package retry

import (
	"math"
	"net/http"
	"strings"
	"time"
)

// Limit is one item of a RateLimit field (draft-ietf-httpapi-ratelimit-headers-11): the
// current state of one quota policy, e.g. `"orders-per-key";r=3;t=1`.
type Limit struct {
	// Policy is the policy name (the item's string).
	Policy string
	// Remaining is the r parameter: quota units left in the current window.
	Remaining int64
	// Reset is the t parameter: time until the quota resets. Valid only when HasReset.
	Reset    time.Duration
	HasReset bool
}

// Quota is one item of a RateLimit-Policy field, e.g. `"orders-per-key";q=10;w=1`.
type Quota struct {
	// Policy is the policy name (the item's string).
	Policy string
	// Quota is the q parameter: quota units allowed per window.
	Quota int64
	// Window is the w parameter. Valid only when HasWindow.
	Window    time.Duration
	HasWindow bool
	// Unit is the qu parameter: what the quota counts, "requests" when absent (the draft's
	// default), else e.g. "content-bytes", "concurrent-requests" or an API's own ("tokens").
	Unit string
}

// ParseRateLimit parses the RateLimit field; several field lines are joined as one list.
// Following the draft (and RFC 9651), a field that is not a valid Structured Field List is
// ignored as a whole (nil), and an item whose name or parameters are invalid — not a string
// or token, r missing or negative, t present but not a non-negative integer — is dropped
// while the others are kept. Reset values are capped at [MaxRetryAfter].
func ParseRateLimit(h http.Header) []Limit {
	items := fieldItems(h, "RateLimit")
	var out []Limit
	for _, it := range items {
		name, ok := itemName(it)
		if !ok {
			continue
		}
		r, ok := nonNegativeParam(it, "r")
		if !ok {
			continue
		}
		l := Limit{Policy: name, Remaining: r}
		if _, present := it.param("t"); present {
			t, ok := nonNegativeParam(it, "t")
			if !ok {
				continue
			}
			l.Reset, l.HasReset = seconds(t), true
		}
		out = append(out, l)
	}
	return out
}

// ParseRateLimitPolicy parses the RateLimit-Policy field with the same rules as
// [ParseRateLimit]: q is required and non-negative, w optional and non-negative.
func ParseRateLimitPolicy(h http.Header) []Quota {
	items := fieldItems(h, "RateLimit-Policy")
	var out []Quota
	for _, it := range items {
		name, ok := itemName(it)
		if !ok {
			continue
		}
		q, ok := nonNegativeParam(it, "q")
		if !ok {
			continue
		}
		p := Quota{Policy: name, Quota: q, Unit: "requests"}
		if v, present := it.param("qu"); present {
			u, ok := v.(string)
			if !ok || u == "" {
				continue
			}
			p.Unit = u
		}
		if _, present := it.param("w"); present {
			w, ok := nonNegativeParam(it, "w")
			if !ok {
				continue
			}
			p.Window, p.HasWindow = time.Duration(min(w, math.MaxInt64/int64(time.Second)))*time.Second, true
		}
		out = append(out, p)
	}
	return out
}

func fieldItems(h http.Header, name string) []sfItem {
	lines := h.Values(name)
	if len(lines) == 0 {
		return nil
	}
	items, err := parseSFList(strings.Join(lines, ","))
	if err != nil {
		return nil
	}
	return items
}

func itemName(it sfItem) (string, bool) {
	switch v := it.value.(type) {
	case string:
		return v, true
	case sfToken:
		return string(v), true
	}
	return "", false
}

func nonNegativeParam(it sfItem, key string) (int64, bool) {
	v, ok := it.param(key)
	if !ok {
		return 0, false
	}
	n, ok := v.(int64)
	return n, ok && n >= 0
}

// seconds converts a non-negative number of seconds to a Duration capped at MaxRetryAfter.
func seconds(n int64) time.Duration {
	if n >= int64(MaxRetryAfter/time.Second) {
		return MaxRetryAfter
	}
	return time.Duration(n) * time.Second
}

// Units returns the quota unit of each policy that RateLimit-Policy names, by policy name
// ("requests" for a policy without qu). A RateLimit item whose policy is not named here
// counts requests.
func Units(h http.Header) map[string]string {
	qs := ParseRateLimitPolicy(h)
	if len(qs) == 0 {
		return nil
	}
	out := make(map[string]string, len(qs))
	for _, q := range qs {
		out[q.Policy] = q.Unit
	}
	return out
}
