// Package tracing is Sluice's one door to OpenTelemetry: it builds a process's tracer from the
// config's tracing section and carries W3C trace context in and out of HTTP headers and jobs.
// The process packages (internal/ingress, internal/worker) start their spans through a
// [*Tracer]; internal/app makes it and flushes it at shutdown. The algorithm packages and the
// client SDK know nothing of it.
//
// # Model
//
// A nil *Tracer is tracing off, and every method of a nil *Tracer is a no-op that allocates
// nothing: callers ask [Tracer.On] before they build a span's attributes, so a process without
// a tracing section pays one nil check per place that could trace. With tracing on, spans go
// through a batching processor to an OTLP/HTTP exporter (protobuf), and the sampler is
// parent-based: a request that arrives with a sampled traceparent is traced, one that arrives
// unsampled is not, and a request without one starts a trace with probability sample_ratio
// (default 1: every one). A job carries the trace context of the span that enqueued it
// ([Format], [Parse]), so every delivery, in whatever process, continues the same trace and
// follows that trace's sampling decision.
//
// # Guarantees
//
//   - Tracing never fails a request or a delivery: an exporter that cannot reach its collector
//     drops spans (the SDK logs why) and the batch queue bounds what waits (2048 spans).
//   - A traceparent or tracestate that does not parse is ignored, as W3C Trace Context says:
//     the span starts a new trace.
//   - Shutdown flushes what is batched, within its context.
//
// # Costs
//
// Off: nothing. On: a span is a few hundred bytes and a few allocations; the batch is exported
// every 5s or 512 spans (the SDK's defaults, which OTEL_BSP_* variables change), and
// OTEL_EXPORTER_OTLP_HEADERS and the other OTEL_EXPORTER_OTLP_* variables of the exporter apply
// where the config sets nothing. docs/tracing.md lists the spans and their attributes.
package tracing

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-rl/sluice/internal/config"
)

// Scope is the instrumentation scope of Sluice's spans.
const Scope = "github.com/sluice-rl/sluice"

// Tracer starts Sluice's spans and exports them. A nil *Tracer is tracing off. It is safe for
// concurrent use.
type Tracer struct {
	tp *sdktrace.TracerProvider
	t  trace.Tracer
	// transport carries the exports; Shutdown closes its idle connections. Nil for NewWith.
	transport *http.Transport
}

// New returns the tracer of cfg for a process named service ("sluice-ingress",
// "sluice-worker"), or nil when cfg is nil (no tracing section). Nothing is dialled here: the
// exporter connects on its first export.
func New(ctx context.Context, cfg *config.Tracing, service string) (*Tracer, error) {
	if cfg == nil {
		return nil, nil
	}
	opts, err := exporterOptions(cfg.OTLP)
	if err != nil {
		return nil, err
	}
	transport := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 5 * time.Second,
	}
	opts = append(opts, otlptracehttp.WithHTTPClient(&http.Client{Transport: transport, Timeout: exportTimeout}))
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: exporter: %w", err)
	}
	t := NewWith(sdktrace.NewBatchSpanProcessor(exp), cfg.SampleRatio, service)
	t.transport = transport
	return t, nil
}

// exportTimeout bounds one export request.
const exportTimeout = 10 * time.Second

// NewWith returns a tracer whose spans go to sp, sampled as New's are at ratio (0 to 1) for
// traces that start here. For tests of the processes' spans.
func NewWith(sp sdktrace.SpanProcessor, ratio float64, service string) *Tracer {
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSpanProcessor(sp),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", service))),
	)
	return &Tracer{tp: tp, t: tp.Tracer(Scope)}
}

// exporterOptions points the exporter at endpoint, an OTLP/HTTP collector's base URL: its path
// gets /v1/traces appended unless it already ends so.
func exporterOptions(endpoint string) ([]otlptracehttp.Option, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("tracing: otlp: want an http or https URL, got %q", endpoint)
	}
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(u.Host), otlptracehttp.WithURLPath(tracesPath(u.Path))}
	if u.Scheme == "http" {
		opts = append(opts, otlptracehttp.WithInsecure())
	}
	return opts, nil
}

// tracesPath is where the spans of a collector whose base URL has path p are posted.
func tracesPath(p string) string {
	if strings.HasSuffix(p, "/v1/traces") {
		return p
	}
	return path.Join("/", p, "v1/traces")
}

// On reports whether tracing is on. Callers build attributes and links only when it is.
func (t *Tracer) On() bool { return t != nil }

// Start starts a span named name as a child of the span in ctx (a remote one included). Off,
// it returns ctx and a non-recording span, allocating nothing.
func (t *Tracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if t == nil {
		return ctx, noSpan
	}
	return t.t.Start(ctx, name, opts...)
}

// noSpan is the span of a nil Tracer.
var noSpan = trace.SpanFromContext(context.Background())

// Shutdown flushes the batched spans and stops the exporter, within ctx.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	err := t.tp.Shutdown(ctx)
	if t.transport != nil {
		t.transport.CloseIdleConnections()
	}
	return err
}

// w3c reads and writes traceparent and tracestate.
var w3c propagation.TraceContext

// Extract returns ctx carrying the remote span context of h's traceparent and tracestate, or
// ctx itself when they are absent or invalid.
func Extract(ctx context.Context, h http.Header) context.Context {
	return w3c.Extract(ctx, propagation.HeaderCarrier(h))
}

// Inject sets h's traceparent (and tracestate, when not empty) to the span in ctx; it removes
// any the headers held when ctx carries no valid span, so that no stale context travels on.
func Inject(ctx context.Context, h http.Header) {
	h.Del("Traceparent")
	h.Del("Tracestate")
	w3c.Inject(ctx, propagation.HeaderCarrier(h))
}

// Format returns the traceparent and tracestate of sc, "" for an invalid one: what a job
// stores of the span that enqueued it.
func Format(sc trace.SpanContext) (traceparent, tracestate string) {
	if !sc.IsValid() {
		return "", ""
	}
	h := http.Header{}
	w3c.Inject(trace.ContextWithSpanContext(context.Background(), sc), propagation.HeaderCarrier(h))
	return h.Get("Traceparent"), h.Get("Tracestate")
}

// Parse returns the remote span context of a traceparent and tracestate as Format wrote them;
// an invalid span context when traceparent is empty or does not parse.
func Parse(traceparent, tracestate string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	c := propagation.MapCarrier{"traceparent": traceparent}
	if tracestate != "" {
		c["tracestate"] = tracestate
	}
	return trace.SpanContextFromContext(w3c.Extract(context.Background(), c))
}
