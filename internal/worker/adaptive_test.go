package worker

import (
	"net/http"
	"testing"
	"time"
)

// TestQuotaRate: the rate that spends the quota an upstream says is left by its reset, from the
// IETF RateLimit header (the policy with the least left) or X-RateLimit-Remaining/-Reset.
func TestQuotaRate(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		h    http.Header
		want float64
		ok   bool
	}{
		{http.Header{"Ratelimit": {`"a";r=10;t=5, "b";r=30;t=10`}}, 2, true},
		{http.Header{"X-Ratelimit-Remaining": {"20"}, "X-Ratelimit-Reset": {"4"}}, 5, true},
		{http.Header{"X-Ratelimit-Remaining": {"20"}}, 0, false},
		{http.Header{}, 0, false},
	} {
		got, ok := quotaRate(tc.h, now)
		if ok != tc.ok || got != tc.want {
			t.Errorf("quotaRate(%v) = %v, %v; want %v, %v", tc.h, got, ok, tc.want, tc.ok)
		}
	}
}
