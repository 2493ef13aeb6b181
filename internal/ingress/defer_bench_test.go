package ingress

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/queue"
)

// nullEnqueuer stores nothing and answers at once: the defer path's cost in the ingress alone,
// without JetStream's round trip.
type nullEnqueuer struct{ seq atomic.Uint64 }

func (e *nullEnqueuer) Publish(_ context.Context, job *queue.Job) (queue.Receipt, error) {
	return queue.Receipt{ID: "job", Seq: e.seq.Add(1)}, nil
}
func (e *nullEnqueuer) Status(context.Context, string) (queue.Status, error) {
	return queue.Status{}, queue.ErrNotFound
}
func (e *nullEnqueuer) Info(context.Context, string) (queue.Info, error) { return queue.Info{}, nil }
func (e *nullEnqueuer) TenantID(key []byte) (string, error)              { return "t", nil }
func (e *nullEnqueuer) Backlog(context.Context, string) (queue.Backlog, error) {
	return queue.Backlog{}, nil
}
func (e *nullEnqueuer) Place(context.Context, queue.Status) (queue.Place, error) {
	return queue.Place{}, nil
}

// BenchmarkIngressDeferMemory is the defer path of the in-process ingress: match a rule with
// action: enqueue, read the body, build the job and its envelope's fields, publish (to an
// enqueuer that stores nothing) and answer 202 with its body.
func BenchmarkIngressDeferMemory(b *testing.B) { benchDefer(b, func(*Options) {}) }

// benchDefer runs the defer path's benchmark with the options opts sets.
func benchDefer(b *testing.B, opts func(*Options)) {
	o := Options{Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler), Enqueuer: &nullEnqueuer{}}
	opts(&o)
	s, err := New(parseConfig(b, "http://127.0.0.1:1", `
queues:
  - { name: exports, rate: 100/s }
rules:
  - { name: deferred, match: { methods: [POST], path: /api/* }, action: enqueue, queue: exports }
`), o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	h := s.Handler()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := &nullWriter{h: http.Header{}}
		body := strings.NewReader(`{"n":1}`)
		r := httptest.NewRequest("POST", "/api/exports", body)
		r.Header.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
		for pb.Next() {
			clear(w.h)
			body.Reset(`{"n":1}`)
			r.Body = readCloser{body}
			h.ServeHTTP(w, r)
			if w.code != http.StatusAccepted {
				b.Fatalf("status %d", w.code)
			}
		}
	})
}

type readCloser struct{ *strings.Reader }

func (readCloser) Close() error { return nil }
