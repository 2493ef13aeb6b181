package ingress

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/limit"
)

// nullWriter is a reusable ResponseWriter that keeps nothing but the status.
type nullWriter struct {
	h    http.Header
	code int
}

func (w *nullWriter) Header() http.Header         { return w.h }
func (w *nullWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *nullWriter) WriteHeader(code int)        { w.code = code }
func (w *nullWriter) Flush()                      {}

func benchServer(b *testing.B, upstreamURL, yaml string) http.Handler {
	b.Helper()
	s, err := New(parseConfig(b, upstreamURL, yaml), Options{Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	return s.Handler()
}

// BenchmarkIngress429Memory is the rejection path of the in-process ingress: match two rules,
// build keys, decide both in memory, answer 429 with headers and a problem body.
func BenchmarkIngress429Memory(b *testing.B) {
	h := benchServer(b, "http://127.0.0.1:1", `
rules:
  - { name: per-key, match: { methods: [POST], path: /api/* }, key: [header:X-API-Key], algorithm: token_bucket, limit: 1, period: 1h }
  - { name: per-ip,  match: { path: /api/* }, key: [ip], algorithm: gcra, limit: 1000000, period: 1s }
`)
	newReq := func() *http.Request {
		r := httptest.NewRequest("POST", "/api/orders", nil)
		r.Header.Set("X-API-Key", "bench")
		return r
	}
	h.ServeHTTP(&nullWriter{h: http.Header{}}, newReq()) // spends the one request (a 502: no upstream)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := &nullWriter{h: http.Header{}}
		r := newReq()
		for pb.Next() {
			clear(w.h)
			h.ServeHTTP(w, r)
			if w.code != http.StatusTooManyRequests {
				b.Fatalf("status %d", w.code)
			}
		}
	})
}

// BenchmarkIngressAllowForwardMemory is the admission path: decide in memory, then forward to
// a loopback upstream and copy its answer back.
func BenchmarkIngressAllowForwardMemory(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok"))
	}))
	b.Cleanup(up.Close)
	h := benchServer(b, up.URL, `
rules:
  - { name: per-ip, match: { path: /api/* }, key: [ip], algorithm: gcra, limit: 1000000000, period: 1s }
`)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		w := &nullWriter{h: http.Header{}}
		r := httptest.NewRequest("GET", "/api/orders", nil)
		for pb.Next() {
			clear(w.h)
			h.ServeHTTP(w, r)
			if w.code != http.StatusOK {
				b.Fatalf("status %d", w.code)
			}
		}
	})
}

// BenchmarkGateAllowMemory is the decision alone, without the proxy.
func BenchmarkGateAllowMemory(b *testing.B) {
	g := testGate(b, parseConfig(b, "http://127.0.0.1:1", `
rules:
  - { name: per-ip, match: { path: /api/* }, key: [ip], algorithm: gcra, limit: 1000000000, period: 1s }
`), Options{})
	e := echo.New()
	e.Pre(gateMiddleware(g))
	e.GET("/*", func(c echo.Context) error { return c.NoContent(http.StatusOK) })
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		w := &nullWriter{h: http.Header{}}
		r := httptest.NewRequest("GET", "/api/orders", nil)
		for pb.Next() {
			clear(w.h)
			e.ServeHTTP(w, r)
		}
	})
}

// BenchmarkQuotaBody compares, in one run, the ways to make the body of a 429: from the
// parts compiled per rule (the gate's path), field by field (Problem.appendJSON, for other
// problems), and with encoding/json's reflection (what the ingress did before).
func BenchmarkQuotaBody(b *testing.B) {
	const name = "orders-per-key"
	const secs = 1200
	head, mid := quotaBody(name)
	p := &Problem{Type: QuotaExceededType, Title: quotaTitle, Status: http.StatusTooManyRequests,
		Detail: quotaDetail([]string{name}, secs), ViolatedPolicies: []string{name}, RetryAfter: secs}
	b.Run("parts", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf = append(buf[:0], head...)
			buf = strconv.AppendInt(buf, secs, 10)
			buf = append(buf, mid...)
			buf = strconv.AppendInt(buf, secs, 10)
			buf = append(buf, '}')
		}
	})
	b.Run("appendJSON", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			p.Detail = quotaDetail(p.ViolatedPolicies, secs)
			buf = p.appendJSON(buf[:0])
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p.Detail = quotaDetail(p.ViolatedPolicies, secs)
			if _, err := json.Marshal(p); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkIngress429Redis is BenchmarkIngress429Memory with the limiter in a real redis-server:
// after the first rejection the key's 429s come from the ingress's cache of the store's
// rejections, without a Redis round trip (compare the two as a ratio in one run).
func BenchmarkIngress429Redis(b *testing.B) {
	rs := testenv.Redis(b)
	s, err := New(parseConfig(b, "http://127.0.0.1:1", `
rules:
  - { name: per-key, match: { methods: [POST], path: /api/* }, key: [header:X-API-Key], algorithm: token_bucket, limit: 1, period: 1h }
  - { name: per-ip,  match: { path: /api/* }, key: [ip], algorithm: gcra, limit: 1000000, period: 1s }
`), Options{Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler),
		Limiter: limit.NewRedis(storeClient(b, rs), limit.RedisConfig{Prefix: testenv.Prefix(b)})})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	h := s.Handler()
	newReq := func() *http.Request {
		r := httptest.NewRequest("POST", "/api/orders", nil)
		r.Header.Set("X-API-Key", "bench")
		return r
	}
	h.ServeHTTP(&nullWriter{h: http.Header{}}, newReq()) // spends the one request
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := &nullWriter{h: http.Header{}}
		r := newReq()
		for pb.Next() {
			clear(w.h)
			h.ServeHTTP(w, r)
			if w.code != http.StatusTooManyRequests {
				b.Fatalf("status %d", w.code)
			}
		}
	})
}
