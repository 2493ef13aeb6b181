package ingress

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/regions"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/limit"
)

// countingLimiter counts the requests of the rule named global that reach the limiter it wraps
// (their keys start with the rule's name and a NUL).
type countingLimiter struct {
	limit.Limiter
	global atomic.Int64
}

func (c *countingLimiter) count(key string) {
	if strings.HasPrefix(key, "global\x00") {
		c.global.Add(1)
	}
}

func (c *countingLimiter) Decide(ctx context.Context, key string, l limit.Limit, cost int64) (limit.Decision, error) {
	c.count(key)
	return c.Limiter.Decide(ctx, key, l, cost)
}

func (c *countingLimiter) DecideAll(ctx context.Context, reqs []limit.Request) ([]limit.Decision, error) {
	for _, r := range reqs {
		c.count(r.Key)
	}
	return c.Limiter.DecideAll(ctx, reqs)
}

// regionalRules has a global rule and a local one over the same requests, a lease: N to fill in.
// Its store_timeout (2s) is one no Redis round trip reaches on a loaded machine: at the default
// 50ms a slow call is a store error, which fails open (a request admitted past the region's
// part, and counted in sluice_store_errors_total), and the test is of the cut, not of timeouts.
const regionalRules = `
store_timeout: 2s
region: a
regions: {names: [a, b], coordinator: nats://127.0.0.1:1}
rules:
  - { name: global, match: { path: /api/* }, key: [header:X-Key], algorithm: fixed_window, limit: 10, period: 1h, global: true %s}
  - { name: local, match: { path: /api/* }, key: [header:X-Key], algorithm: fixed_window, limit: 100, period: 1h }
`

// TestRegionalLimit: a global rule is decided against the part of its limit that
// Options.RegionalLimit (regions.Cut here, as *regions.Holder.Limit) returns. At a share of 0 a
// request is refused without the limiter (no request per key and period slips through), with
// the wait until the region's next renewal as Retry-After and X-RateLimit-Limit: 0, and the
// other rules are not charged for it. At half, half the limit (rounded down). With lease: N above what
// the region's part holds, requests are taken one by one instead of failing as a store error.
func TestRegionalLimit(t *testing.T) {
	rs := testenv.Redis(t)
	for _, tc := range []struct {
		name        string
		lease       string
		fraction    float64
		admitted    int64
		limitHeader string
	}{
		{"share 0 admits nothing", "", 0, 0, "0"},
		{"a share below one request per period admits nothing", "", 0.09, 0, "0"},
		{"half the limit", "", 0.5, 5, "5"},
		{"lease above the region's part", ", lease: 4", 0.3, 3, "3"},
		{"the whole limit", ", lease: 4", 1, 10, "10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim := &countingLimiter{Limiter: limit.NewRedis(storeClient(t, rs), limit.RedisConfig{Prefix: testenv.Prefix(t)})}
			var asked atomic.Int64
			opts := Options{Now: time.Now, Limiter: lim, RegionalLimit: func(rule string, spec limit.Limit) (limit.Limit, time.Duration, bool) {
				if rule != "global" {
					t.Errorf("RegionalLimit asked for rule %q", rule)
				}
				asked.Add(1)
				cut, ok := regions.Cut(spec, tc.fraction)
				return cut, 700 * time.Millisecond, ok
			}}
			f := newFixture(t, fmt.Sprintf(regionalRules, tc.lease), opts)
			var admitted int64
			var last *http.Response
			for range 20 {
				res := f.do("GET", "/api/x", nil, "X-Key", "k1")
				res.Body.Close()
				switch res.StatusCode {
				case http.StatusOK:
					admitted++
				case http.StatusTooManyRequests:
				default:
					t.Fatalf("status %d, want 200 or 429", res.StatusCode)
				}
				last = res
			}
			if admitted != tc.admitted {
				t.Errorf("admitted %d of 20, want %d", admitted, tc.admitted)
			}
			if asked.Load() != 20 {
				t.Errorf("RegionalLimit asked %d times, want once per request (the region's demand)", asked.Load())
			}
			if got := last.Header.Get("X-Ratelimit-Limit"); got != tc.limitHeader {
				t.Errorf("X-RateLimit-Limit %q, want %q", got, tc.limitHeader)
			}
			if tc.admitted == 0 {
				if got := last.Header.Get("Retry-After"); got != "1" {
					t.Errorf("Retry-After %q, want 1 (the 700 ms until the next renewal, rounded up)", got)
				}
			}
			// A refusal by the region's share is like a cached rejection: the other rules are
			// not charged. The store's first refusal charged them (one call for all), then the
			// reject cache answered.
			want := float64(tc.admitted + 1)
			if tc.admitted == 0 {
				want = 0
			}
			if got := metric(t, f.reg, "sluice_decisions_total", "rule", "local", "outcome", "allowed"); got != want {
				t.Errorf("local allowed %v, want %v", got, want)
			}
			if got := lim.global.Load(); (got == 0) != (tc.admitted == 0) {
				t.Errorf("the global rule's key was asked of the limiter %d times; want never at a part that admits nothing, else some", got)
			}
			if got := metric(t, f.reg, "sluice_decisions_total", "rule", "global", "outcome", "rejected"); got != float64(20-tc.admitted) {
				t.Errorf("global rejected %v, want %d", got, 20-tc.admitted)
			}
			if got := metric(t, f.reg, "sluice_store_errors_total"); got != 0 {
				t.Errorf("store errors %v, want 0 (a cut limit is never asked a cost above it)", got)
			}
		})
	}
}
