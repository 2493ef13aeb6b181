package ingress

import (
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-rl/sluice/internal/tracing"
)

const clientTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

const traceRules = `
rules:
  - { name: tight, match: { path: /api/* }, algorithm: token_bucket, limit: 1, period: 1h }
`

// With tracing off, the client's traceparent and tracestate reach the upstream untouched.
func TestTraceOffPassesTheClientsContext(t *testing.T) {
	f := newFixture(t, traceRules, Options{})
	e := readEchoed(t, f.do("GET", "/api/x", nil, "Traceparent", clientTraceparent, "Tracestate", "v=1"))
	if got := e.Header.Get("Traceparent"); got != clientTraceparent || e.Header.Get("Tracestate") != "v=1" {
		t.Fatalf("upstream got traceparent %q tracestate %q, want the client's", got, e.Header.Get("Tracestate"))
	}
}

// With tracing on, the upstream gets the forward span's traceparent in the client's trace, and
// a 429 is a request span with a decide span naming the violated rule.
func TestTraceOnForwardAndReject(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	f := newFixture(t, traceRules, Options{Tracer: tracing.NewWith(rec, 1, "test")})
	e := readEchoed(t, f.do("GET", "/api/x", nil, "Traceparent", clientTraceparent))
	got := e.Header.Get("Traceparent")
	if !strings.HasPrefix(got, "00-4bf92f3577b34da6a3ce929d0e0e4736-") || got == clientTraceparent {
		t.Fatalf("upstream got traceparent %q, want a span of Sluice's in the client's trace", got)
	}
	if res := f.do("GET", "/api/x", nil, "Traceparent", clientTraceparent); res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second request: %d, want 429", res.StatusCode)
	}
	byName := map[string][]string{}
	for _, s := range rec.Ended() {
		var attrs []string
		for _, kv := range s.Attributes() {
			attrs = append(attrs, string(kv.Key)+"="+kv.Value.String())
		}
		byName[s.Name()] = append(byName[s.Name()], strings.Join(attrs, " "))
		if s.Name() == spanForward && !strings.Contains(got, s.SpanContext().SpanID().String()) {
			t.Errorf("forward span %s is not the upstream's parent %s", s.SpanContext().SpanID(), got)
		}
	}
	if len(byName[spanRequest]) != 2 || len(byName[spanForward]) != 1 || len(byName[spanDecide]) != 2 {
		t.Fatalf("spans %v, want two requests, two decisions, one forward", byName)
	}
	if d := byName[spanDecide][1]; !strings.Contains(d, "sluice.decision=reject") || !strings.Contains(d, `sluice.violated=["tight"]`) {
		t.Errorf("the 429's decision span: %s", d)
	}
	if r := byName[spanRequest][1]; !strings.Contains(r, "http.response.status_code=429") {
		t.Errorf("the 429's request span: %s", r)
	}
}
