package ingress

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-rl/sluice/internal/tracing"
	"github.com/sluice-rl/sluice/queue"
)

// The spans of the ingress (docs/tracing.md). Each is started only when Options.Tracer is on:
// with tracing off, a request pays one nil check per place below and allocates nothing more.
const (
	spanRequest = "sluice.request" // the whole request, from the client's traceparent
	spanDecide  = "sluice.decide"  // matching and charging the rules, to the verdict
	spanEnqueue = "sluice.enqueue" // storing a deferred request or submitted job
	spanForward = "sluice.forward" // the forwarded request; the upstream gets its traceparent
)

// verdictNames name the verdicts in the decide span's sluice.decision.
var verdictNames = [...]string{forward: "forward", reject: "reject", failClosed: "fail_closed", deferIt: "defer"}

// traceRequest starts the request's span as a child of the client's traceparent (when it
// carries a valid one) and returns the request carrying it.
func (g *gate) traceRequest(r *http.Request) (*http.Request, trace.Span) {
	ctx := tracing.Extract(r.Context(), r.Header)
	ctx, span := g.tr.Start(ctx, spanRequest, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path)))
	return r.WithContext(ctx), span
}

// endRequest ends the request's span with the status it was answered.
func endRequest(span trace.Span, status int) {
	span.SetAttributes(attribute.Int("http.response.status_code", status))
	if status >= 500 {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	span.End()
}

// traceStart is when the decision starts, when tracing is on; zero when off.
func (g *gate) traceStart() time.Time {
	if g.tr.On() {
		return time.Now()
	}
	return time.Time{}
}

// decided records the decide span when tracing is on (small enough to inline: off, a nil check).
func (g *gate) decided(ctx context.Context, start time.Time, k *call, rl *ruling) {
	if g.tr.On() {
		g.traceDecision(ctx, start, k, rl)
	}
}

// traceDecision records the decide span, from start until now, with what rl decided for k.
func (g *gate) traceDecision(ctx context.Context, start time.Time, k *call, rl *ruling) {
	_, span := g.tr.Start(ctx, spanDecide, trace.WithTimestamp(start))
	matched := make([]string, len(k.matched))
	for i, ru := range k.matched {
		matched[i] = ru.name
	}
	attrs := []attribute.KeyValue{attribute.String("sluice.decision", verdictNames[rl.action]),
		attribute.StringSlice("sluice.rules", matched)}
	if len(rl.viol) > 0 {
		viol := make([]string, len(rl.viol))
		for i, ru := range rl.viol {
			viol[i] = ru.name
		}
		attrs = append(attrs, attribute.StringSlice("sluice.violated", viol))
	}
	if rl.deferTo != nil && rl.action == deferIt {
		attrs = append(attrs, attribute.String("sluice.queue", rl.deferTo.queue))
	}
	span.SetAttributes(attrs...)
	span.End()
}

// startEnqueue starts the enqueue span of job and stores its trace context in the job, so
// that every delivery continues the trace (and follows its sampling).
func (g *gate) startEnqueue(ctx context.Context, job *queue.Job) trace.Span {
	ctx, span := g.tr.Start(ctx, spanEnqueue, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("sluice.queue", job.Queue)))
	if tp, ts := tracing.Format(trace.SpanContextFromContext(ctx)); tp != "" {
		job.Trace = &queue.TraceContext{Traceparent: tp, Tracestate: ts}
	}
	return span
}

// endEnqueue ends the enqueue span with the job's id and tenant, or the error that kept it
// out of the queue.
func endEnqueue(span trace.Span, job *queue.Job, rcpt queue.Receipt, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "not enqueued")
	} else {
		span.SetAttributes(attribute.String("sluice.job", rcpt.ID), attribute.Bool("sluice.replayed", rcpt.Replayed))
	}
	if job.Tenant != "" {
		span.SetAttributes(attribute.String("sluice.tenant", job.Tenant))
	}
	span.End()
}

// traceForward starts the forward span; rewrite sets the outbound traceparent to it.
func (g *gate) traceForward(r *http.Request, upstream string) (*http.Request, trace.Span) {
	ctx, span := g.tr.Start(r.Context(), spanForward, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("sluice.upstream", upstream)))
	return r.WithContext(ctx), span
}
