package ingress

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/inflight"
	"github.com/sluice-rl/sluice/internal/testenv"
)

// BenchmarkIngressConcurrencyForward is the forward path of a request under one concurrency
// rule (limit far above the load: every request takes a place), in memory and in Redis, where
// it reports the round trips of the places' client per request: two, the Acquire before
// forwarding and the Release after the answer.
//
//	SLUICE_STRICT=1 go test -run '^$' -bench IngressConcurrency -benchmem ./internal/ingress/
func BenchmarkIngressConcurrencyForward(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }))
	b.Cleanup(up.Close)
	const yaml = `
rules:
  - { name: conns, match: { path: /api/* }, key: [header:X-API-Key], algorithm: concurrency, limit: 100000 }
`
	run := func(b *testing.B, opts Options, trips *atomic.Int64) {
		opts.Registerer, opts.Logger = prometheus.NewRegistry(), slog.New(slog.DiscardHandler)
		s, err := New(parseConfig(b, up.URL, yaml), opts)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(s.Close)
		h := s.Handler()
		if trips != nil {
			trips.Store(0)
		}
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			w := &nullWriter{h: http.Header{}}
			r := httptest.NewRequest("GET", "/api/x", nil)
			r.Header.Set("X-API-Key", "bench")
			for pb.Next() {
				clear(w.h)
				h.ServeHTTP(w, r)
				if w.code != http.StatusOK {
					b.Fatalf("status %d", w.code)
				}
			}
		})
		if trips != nil {
			b.ReportMetric(float64(trips.Load())/float64(b.N), "round-trips/op")
		}
	}
	b.Run("memory", func(b *testing.B) { run(b, Options{}, nil) })
	b.Run("redis", func(b *testing.B) {
		rs := testenv.Redis(b)
		rdb := storeClient(b, rs)
		hook := &countTrips{}
		rdb.AddHook(hook)
		run(b, Options{Places: inflight.NewRedis(rdb, inflight.WithPrefix(testenv.Prefix(b)))}, &hook.n)
	})
}

// countTrips counts the commands and pipelines a go-redis client sends.
type countTrips struct{ n atomic.Int64 }

func (h *countTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h *countTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}
