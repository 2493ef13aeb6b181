package tracing

import (
	"context"
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// Off is free: a nil Tracer's Start hands back the caller's context and a span that records
// nothing, without allocating.
func TestOffAllocatesNothing(t *testing.T) {
	var tr *Tracer
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		c, span := tr.Start(ctx, "x")
		span.End()
		if c != ctx || span.IsRecording() || tr.On() {
			t.Fatal("a nil Tracer traced")
		}
	})
	if allocs != 0 {
		t.Fatalf("a nil Tracer's Start allocates %v times", allocs)
	}
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// A job's stored context reads back as the span's, tracestate included; what does not parse
// is no context at all.
func TestFormatParse(t *testing.T) {
	ctx := Extract(context.Background(), http.Header{
		"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, "Tracestate": {"a=1,b=2"}})
	sc := trace.SpanContextFromContext(ctx)
	tp, ts := Format(sc)
	if tp != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" || ts != "a=1,b=2" {
		t.Fatalf("Format = %q %q", tp, ts)
	}
	if got := Parse(tp, ts); !got.Equal(sc.WithRemote(true)) {
		t.Fatalf("Parse = %v, want %v", got, sc)
	}
	for _, bad := range []string{"", "00-xyz", "00-00000000000000000000000000000000-00f067aa0ba902b7-01"} {
		if Parse(bad, "").IsValid() {
			t.Errorf("Parse(%q) is valid", bad)
		}
	}
	if tp, ts := Format(trace.SpanContext{}); tp != "" || ts != "" {
		t.Errorf("Format(invalid) = %q %q", tp, ts)
	}
}

// Sampling is parent-based: a sampled parent is traced, an unsampled one is not even at
// ratio 1, and at ratio 0 a trace that starts here is not sampled.
func TestParentBasedSampling(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	for _, tc := range []struct {
		traceparent string
		ratio       float64
		want        bool
	}{
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", 0, true},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", 1, false},
		{"", 1, true},
		{"", 0, false},
	} {
		tr := NewWith(rec, tc.ratio, "test")
		ctx := Extract(context.Background(), http.Header{"Traceparent": {tc.traceparent}})
		_, span := tr.Start(ctx, "s")
		if got := span.SpanContext().IsSampled(); got != tc.want {
			t.Errorf("parent %q ratio %v: sampled %v, want %v", tc.traceparent, tc.ratio, got, tc.want)
		}
		span.End()
		h := http.Header{"Traceparent": {"stale"}}
		Inject(trace.ContextWithSpan(context.Background(), span), h)
		if h.Get("Traceparent") == "stale" || h.Get("Traceparent") == "" {
			t.Errorf("Inject left %q", h.Get("Traceparent"))
		}
		_ = tr.Shutdown(context.Background())
	}
}

// The collector's URL is a base URL: /v1/traces is appended unless its path ends so; only
// http and https URLs are taken.
func TestExporterPath(t *testing.T) {
	for in, want := range map[string]string{"": "/v1/traces", "/": "/v1/traces", "/otlp": "/otlp/v1/traces",
		"/otlp/": "/otlp/v1/traces", "/v1/traces": "/v1/traces", "/x/v1/traces": "/x/v1/traces"} {
		if got := tracesPath(in); got != want {
			t.Errorf("tracesPath(%q) = %q, want %q", in, got, want)
		}
	}
	for _, bad := range []string{"c:4318", "grpc://c:4317", "http://"} {
		if _, err := exporterOptions(bad); err == nil {
			t.Errorf("exporterOptions(%q) took it", bad)
		}
	}
	if _, err := exporterOptions("https://c/otlp"); err != nil {
		t.Error(err)
	}
}
