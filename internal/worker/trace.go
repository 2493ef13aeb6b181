package worker

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-rl/sluice/internal/tracing"
	"github.com/sluice-rl/sluice/retry"
)

// The spans of a job's pass (docs/tracing.md), both children of the span that enqueued the
// job (queue.Job.Trace), so that one trace runs from the client's request through the
// queue to every delivery; a job enqueued without tracing starts a trace of its own. They are
// made only when Deps.Tracer is on: with tracing off a pass pays a nil check per place.
const (
	spanAdmission = "sluice.admission" // the wait for the admitters' go (slot, place, budget, pause)
	spanDeliver   = "sluice.deliver"   // one delivery attempt; the upstream gets its traceparent
)

// jobContext returns ctx carrying, as the remote parent, the span that enqueued j's job, and
// that span's context (invalid for a job without one).
func jobContext(ctx context.Context, j *job) (context.Context, trace.SpanContext) {
	tc := j.m.Job.Trace
	if tc == nil {
		return ctx, trace.SpanContext{}
	}
	sc := tracing.Parse(tc.Traceparent, tc.Tracestate)
	if !sc.IsValid() {
		return ctx, sc
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc), sc
}

// jobAttributes are the attributes every span of j's pass carries.
func jobAttributes(j *job) []attribute.KeyValue {
	a := []attribute.KeyValue{attribute.String("sluice.queue", j.queue), attribute.String("sluice.job", j.m.Job.ID),
		attribute.Int64("sluice.delivery", int64(j.m.Delivered))}
	if j.m.Job.Tenant != "" {
		a = append(a, attribute.String("sluice.tenant", j.m.Job.Tenant))
	}
	return a
}

// admissionTrace is the span of one run of the admitters: an event for each admitter's answer,
// with how long it took to give it, and how the run ended.
type admissionTrace struct {
	span trace.Span
	last time.Time
}

// startAdmission starts the admission span of j and returns the context the admitters get.
func (at *admissionTrace) start(ctx context.Context, tr *tracing.Tracer, j *job) context.Context {
	ctx, _ = jobContext(ctx, j)
	ctx, at.span = tr.Start(ctx, spanAdmission, trace.WithAttributes(jobAttributes(j)...))
	at.last = time.Now()
	return ctx
}

// admitted records admitter a's verdict v as an event: which admitter (its type, the only name
// the pipeline knows it by), what it said, and how long it took to say it.
func (at *admissionTrace) admitted(a admitter, v verdict) {
	now := time.Now()
	attrs := []attribute.KeyValue{
		attribute.String("sluice.admitter", strings.TrimPrefix(strings.TrimPrefix(fmt.Sprintf("%T", a), "*"), "worker.")),
		attribute.String("sluice.verdict", verdictNames[v.kind]),
		attribute.Float64("sluice.waited_seconds", now.Sub(at.last).Seconds()),
	}
	if v.reason != "" {
		attrs = append(attrs, attribute.String("sluice.reason", v.reason))
	}
	at.span.AddEvent("admit", trace.WithAttributes(attrs...), trace.WithTimestamp(now))
	at.last = now
}

var verdictNames = [...]string{admitGo: "go", admitHold: "hold", admitRefuse: "refuse"}

// end ends the span with how admission ended: go, or the end of the pass it made.
func (at *admissionTrace) end(out outcome, stop bool) {
	result := "go"
	if stop {
		result = passEndNames[out.end]
	}
	at.span.SetAttributes(attribute.String("sluice.admission", result))
	at.span.End()
}

var passEndNames = [...]string{endDelivered: "delivered", endFinal: "final", endExhausted: "exhausted",
	endNotSent: "not_sent", endCanceled: "canceled", endWithdrawn: "withdrawn", endInterrupted: "interrupted",
	endHold: "hold"}

// startDelivery starts the span of j's delivery attempt: a child of the span that enqueued
// it, and linked to it (the link says "caused by", which stays true when a tool shows
// deliveries apart from their trace). ctx then carries it to the request's traceparent.
func startDelivery(ctx context.Context, tr *tracing.Tracer, j *job, attempt int, start time.Time) (context.Context, trace.Span) {
	ctx, sc := jobContext(ctx, j)
	attrs := append(jobAttributes(j), attribute.Int("sluice.attempt", attempt))
	if !j.m.Job.CreatedAt.IsZero() {
		attrs = append(attrs, attribute.Float64("sluice.wait_seconds", max(start.Sub(j.m.Job.CreatedAt), 0).Seconds()))
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...)}
	if sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc,
			Attributes: []attribute.KeyValue{attribute.String("sluice.link", "enqueue")}}))
	}
	return tr.Start(ctx, spanDeliver, opts...)
}

// endDelivery ends a delivery's span with the upstream's answer and its class.
func endDelivery(span trace.Span, c retry.Outcome, err error) {
	span.SetAttributes(attribute.String("sluice.class", c.Class.String()))
	if c.Status != 0 {
		span.SetAttributes(attribute.Int("http.response.status_code", c.Status))
	}
	if err != nil {
		span.RecordError(logged(err)) // as the log has it: no query string or userinfo
	}
	if c.Class != retry.Success {
		span.SetStatus(codes.Error, c.Class.String())
	}
	span.End()
}
