package ingress

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/limit"
)

// BenchmarkGateBudgets compares, in one run, the decision of a rule with one budget and with
// two (input and output tokens, costs from headers so that no body is read), in memory and
// against a real redis-server with 32 requests in flight; and the refusal of a request by one
// of two budgets, whose other charge is then given back (one more round trip).
func BenchmarkGateBudgets(b *testing.B) {
	rs := testenv.Redis(b)
	const one = `
store_timeout: 1s
rules:
  - name: llm
    match: { path: /api/* }
    key: [header:X-API-Key]
    algorithm: token_bucket
    budgets:
      - { name: input, limit: 1000000000, period: 1s, cost: 'header:X-In' }
`
	const two = one + `      - { name: output, limit: 1000000000, period: 1s, cost: 'header:X-Out' }
`
	const refused = `
store_timeout: 1s
rules:
  - name: llm
    match: { path: /api/* }
    key: [header:X-API-Key]
    algorithm: token_bucket
    budgets:
      - { name: input, limit: 1, period: 1h, cost: 'header:X-In' }
      - { name: output, limit: 1000000000, period: 1s, cost: 'header:X-Out' }
`
	for _, store := range []string{"memory", "redis"} {
		for _, c := range []struct {
			name, yaml string
			want       int
		}{{"one-budget", one, http.StatusOK}, {"two-budgets", two, http.StatusOK}, {"two-budgets-one-refuses", refused, http.StatusTooManyRequests}} {
			b.Run(store+"/"+c.name, func(b *testing.B) {
				opts := Options{Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)}
				if store == "redis" {
					opts.Limiter = limit.NewRedis(storeClient(b, rs), limit.RedisConfig{Prefix: testenv.Prefix(b) + store + c.name})
				}
				g := testGate(b, parseConfig(b, "http://127.0.0.1:1", c.yaml), opts)
				e := echo.New()
				e.Pre(gateMiddleware(g))
				e.GET("/*", func(c echo.Context) error { return c.NoContent(http.StatusOK) })
				newReq := func() *http.Request {
					r := httptest.NewRequest("GET", "/api/chat", nil)
					r.Header.Set("X-API-Key", "bench")
					r.Header.Set("X-In", "1")
					r.Header.Set("X-Out", "1")
					return r
				}
				e.ServeHTTP(&nullWriter{h: http.Header{}}, newReq()) // spends the refusing budget's one unit
				b.ReportAllocs()
				b.SetParallelism(16) // × GOMAXPROCS (2): 32 in flight
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					w := &nullWriter{h: http.Header{}}
					r := newReq()
					for pb.Next() {
						clear(w.h)
						e.ServeHTTP(w, r)
						if w.code != c.want {
							b.Fatalf("status %d, want %d", w.code, c.want)
						}
					}
				})
			})
		}
	}
}
