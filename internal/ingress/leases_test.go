package ingress

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/limit"
)

// With lease: 10, one request takes 10 from the store and the next 9 are admitted without it
// (here, with redis-server stopped); once the lease is spent, the store is asked again.
func TestLeaseAdmitsLocally(t *testing.T) {
	rs := testenv.Redis(t)
	f := newFixture(t, `
store_timeout: 200ms
on_store_error: deny
rules:
  - { name: per-key, match: { path: /api/* }, key: [header:X-API-Key], algorithm: token_bucket, limit: 100, period: 1h, lease: 10 }
`, Options{Now: time.Now, Limiter: limit.NewRedis(storeClient(t, rs), limit.RedisConfig{Prefix: testenv.Prefix(t)})})
	get := func() int {
		res := f.do("GET", "/api/x", nil, "X-API-Key", "k1")
		res.Body.Close()
		return res.StatusCode
	}
	if got := get(); got != http.StatusOK {
		t.Fatalf("first request: %d", got)
	}
	rs.Stop()
	for i := range 9 {
		if got := get(); got != http.StatusOK {
			t.Fatalf("request %d with redis stopped: %d, want 200 from the lease", i+2, got)
		}
	}
	if got := metric(t, f.reg, "sluice_leased_decisions_total"); got != 9 {
		t.Errorf("leased decisions %v, want 9", got)
	}
	if got := get(); got != http.StatusServiceUnavailable {
		t.Fatalf("11th request with redis stopped: %d, want 503 (the lease is spent, the store is down)", got)
	}
}

// Leases never admit more than the store would within a window: two ingresses with lease: 10
// on a limit of 15 admit 15 between them, the second asking for single requests once fewer than
// 10 are left.
func TestLeasesStayWithinTheLimit(t *testing.T) {
	rs := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	cfg := `
rules:
  - { name: per-key, match: { path: /api/* }, key: [header:X-API-Key], algorithm: fixed_window, limit: 15, period: 1h, lease: 10 }
`
	a := newFixture(t, cfg, Options{Now: time.Now, Limiter: limit.NewRedis(storeClient(t, rs), limit.RedisConfig{Prefix: prefix})})
	b := newFixture(t, cfg, Options{Now: time.Now, Limiter: limit.NewRedis(storeClient(t, rs), limit.RedisConfig{Prefix: prefix})})
	admitted := 0
	for i := range 40 {
		f := a
		if i%2 == 1 {
			f = b
		}
		res := f.do("GET", "/api/x", nil, "X-API-Key", "k1")
		res.Body.Close()
		switch res.StatusCode {
		case http.StatusOK:
			admitted++
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("status %d", res.StatusCode)
		}
	}
	if admitted != 15 {
		t.Errorf("two ingresses with leases admitted %d, want the limit, 15", admitted)
	}
}

// BenchmarkGateAllowRedis compares, in one run, the allowed path against a real redis-server
// without a lease and with lease: 100 (99 of 100 decisions made in-process), with 64 requests
// in flight as under load (the Redis store coalesces concurrent decisions into pipelines).
func BenchmarkGateAllowRedis(b *testing.B) {
	rs := testenv.Redis(b)
	for _, lease := range []string{"", ", lease: 100"} {
		name := "no-lease"
		if lease != "" {
			name = "lease-100"
		}
		b.Run(name, func(b *testing.B) {
			g := testGate(b, parseConfig(b, "http://127.0.0.1:1", `
rules:
  - { name: per-key, match: { path: /api/* }, key: [header:X-API-Key], algorithm: gcra, limit: 1000000000, period: 1s`+lease+` }
`), Options{Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler),
				Limiter: limit.NewRedis(storeClient(b, rs), limit.RedisConfig{Prefix: testenv.Prefix(b) + name})})
			e := echo.New()
			e.Pre(gateMiddleware(g))
			e.GET("/*", func(c echo.Context) error { return c.NoContent(http.StatusOK) })
			b.ReportAllocs()
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				w := &nullWriter{h: http.Header{}}
				r := httptest.NewRequest("GET", "/api/orders", nil)
				r.Header.Set("X-API-Key", "bench")
				for pb.Next() {
					clear(w.h)
					e.ServeHTTP(w, r)
					if w.code != http.StatusOK {
						b.Fatalf("status %d", w.code)
					}
				}
			})
		})
	}
}
