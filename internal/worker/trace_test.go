package worker

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-rl/sluice/internal/tracing"
	"github.com/sluice-rl/sluice/queue"
)

// Admission with tracing on is one span per run, a child of the span that enqueued the job,
// with an event per admitter's verdict and how the run ended; a job without a stored context
// starts a trace of its own.
func TestAdmissionTraced(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tr := tracing.NewWith(rec, 1, "test")
	var log []string
	ps := newPolicies(&scripted{name: "a", verdicts: []verdict{pass()}, log: &log},
		&scripted{name: "b", verdicts: []verdict{holdUntil(time.Now().Add(time.Minute), "paused")}, log: &log})
	ps.tr = tr
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	j := testJob("j1", "t1")
	j.m.Job.Trace = &queue.TraceContext{Traceparent: tp}
	if _, out, stop := ps.admission(context.Background(), &QueueConfig{}, j, time.Now); !stop || out.end != endHold {
		t.Fatalf("admission = %v %v, want a hold", out, stop)
	}
	plain := testJob("j2", "")
	ps.admit = ps.admit[:1]
	if _, _, stop := ps.admission(context.Background(), &QueueConfig{}, plain, time.Now); stop {
		t.Fatal("admission of j2 stopped")
	}
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	held, passed := spans[0], spans[1]
	if held.Parent().SpanID().String() != "00f067aa0ba902b7" || held.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("held job's admission: parent %v, want the enqueue span", held.Parent())
	}
	if ev := held.Events(); len(ev) != 2 || ev[1].Name != "admit" {
		t.Fatalf("events %v, want one per admitter", ev)
	}
	attrs := map[string]string{}
	for _, kv := range held.Events()[1].Attributes {
		attrs[string(kv.Key)] = kv.Value.String()
	}
	if attrs["sluice.admitter"] != "scripted" || attrs["sluice.verdict"] != "hold" || attrs["sluice.reason"] != "paused" {
		t.Errorf("the hold's event: %v", attrs)
	}
	end := map[string]string{}
	for _, kv := range held.Attributes() {
		end[string(kv.Key)] = kv.Value.String()
	}
	if end["sluice.admission"] != "hold" || end["sluice.tenant"] != "t1" || end["sluice.job"] != "j1" {
		t.Errorf("held span's attributes: %v", end)
	}
	if passed.Parent().IsValid() {
		t.Errorf("a job without a stored context got parent %v", passed.Parent())
	}
}
