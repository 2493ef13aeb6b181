package ingress

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-rl/sluice/internal/tracing"
)

// benchTracer is tracing on, every trace sampled, its spans batched to an exporter that drops
// them: what tracing costs the ingress itself.
func benchTracer(b *testing.B) *tracing.Tracer {
	tr := tracing.NewWith(sdktrace.NewBatchSpanProcessor(tracetest.NewNoopExporter()), 1, "bench")
	b.Cleanup(func() { _ = tr.Shutdown(b.Context()) })
	return tr
}

// BenchmarkIngressDeferMemoryTraced is BenchmarkIngressDeferMemory with tracing on.
func BenchmarkIngressDeferMemoryTraced(b *testing.B) {
	tr := benchTracer(b)
	benchDefer(b, func(o *Options) { o.Tracer = tr })
}

// BenchmarkIngress429MemoryTraced is BenchmarkIngress429Memory with tracing on.
func BenchmarkIngress429MemoryTraced(b *testing.B) {
	s, err := New(parseConfig(b, "http://127.0.0.1:1", `
rules:
  - { name: per-key, match: { methods: [POST], path: /api/* }, key: [header:X-API-Key], algorithm: token_bucket, limit: 1, period: 1h }
  - { name: per-ip,  match: { path: /api/* }, key: [ip], algorithm: gcra, limit: 1000000, period: 1s }
`), Options{Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler), Tracer: benchTracer(b)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	h := s.Handler()
	newReq := func() *http.Request {
		r := httptest.NewRequest("POST", "/api/orders", nil)
		r.Header.Set("X-API-Key", "bench")
		r.Header.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
		return r
	}
	h.ServeHTTP(&nullWriter{h: http.Header{}}, newReq())
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
