package ingress

import (
	"net/http"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/limit"
)

// TestRejectionsCached: once the Redis store rejects a key, the ingress answers 429 for it from
// its cache until the key's Retry-After has passed — proven by stopping redis-server, which
// would otherwise make the rule fail open — and then asks the store again. The request's other
// rules are not charged while the cached rejection decides.
func TestRejectionsCached(t *testing.T) {
	rs := testenv.Redis(t)
	f := newFixture(t, `
store_timeout: 200ms
rules:
  - { name: per-key, match: { path: /api/* }, key: [header:X-API-Key], algorithm: fixed_window, limit: 1, period: 2s }
  - { name: wide, match: { path: /api/* }, key: [const:all], algorithm: fixed_window, limit: 1000, period: 1h }
`, Options{Now: time.Now, Limiter: limit.NewRedis(storeClient(t, rs), limit.RedisConfig{Prefix: testenv.Prefix(t)})})
	get := func() int {
		res := f.do("GET", "/api/x", nil, "X-API-Key", "k1")
		res.Body.Close()
		return res.StatusCode
	}
	if got := get(); got != http.StatusOK {
		t.Fatalf("first request: %d", got)
	}
	if got := get(); got != http.StatusTooManyRequests {
		t.Fatalf("second request: %d, want 429 from the store", got)
	}
	wideBefore := metric(t, f.reg, "sluice_decisions_total", "rule", "wide", "outcome", "allowed")
	rs.Stop()
	for range 3 {
		if got := get(); got != http.StatusTooManyRequests {
			t.Fatalf("with redis stopped: %d, want 429 from the cache", got)
		}
	}
	if got := metric(t, f.reg, "sluice_cached_rejections_total"); got != 3 {
		t.Errorf("cached rejections %v, want 3", got)
	}
	if got := metric(t, f.reg, "sluice_decisions_total", "rule", "wide", "outcome", "allowed"); got != wideBefore {
		t.Errorf("the other rule was charged %v times during cached rejections", got-wideBefore)
	}
	// After the Retry-After the store is asked again: it is down, so the rule fails open.
	testenv.WaitFor(t, 5*time.Second, "the cached rejection to expire", func() bool { return get() == http.StatusOK })
}
