package app

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// receivedSpan is a span an in-test OTLP/HTTP receiver got, with its process's service.name.
type receivedSpan struct {
	service string
	*tracepb.Span
}

func (s receivedSpan) trace() string  { return hex.EncodeToString(s.TraceId) }
func (s receivedSpan) id() string     { return hex.EncodeToString(s.SpanId) }
func (s receivedSpan) parent() string { return hex.EncodeToString(s.ParentSpanId) }

// attr returns the attribute key of s as text ("" when absent).
func (s receivedSpan) attr(key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return anyValue(kv.Value)
		}
	}
	return ""
}

func anyValue(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonpb.AnyValue_DoubleValue:
		return fmt.Sprint(x.DoubleValue)
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	}
	return fmt.Sprint(v)
}

// otlpReceiver is a collector's OTLP/HTTP trace endpoint: it decodes each export request
// (protobuf, go.opentelemetry.io/proto/otlp) and keeps its spans.
type otlpReceiver struct {
	url   string
	mu    sync.Mutex
	spans []receivedSpan
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	rc := &otlpReceiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" || r.Method != http.MethodPost {
			t.Errorf("OTLP export to %s %s, want POST /v1/traces", r.Method, r.URL.Path)
			http.NotFound(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &req)
		}
		if err != nil {
			t.Errorf("OTLP export (%s): %v", r.Header.Get("Content-Type"), err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		for _, rs := range req.ResourceSpans {
			service := ""
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					service = anyValue(kv.Value)
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					rc.spans = append(rc.spans, receivedSpan{service: service, Span: s})
				}
			}
		}
		rc.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(srv.Close)
	rc.url = srv.URL
	return rc
}

// named returns the spans of trace named name, in the order they were received.
func (rc *otlpReceiver) named(trace, name string) []receivedSpan {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []receivedSpan
	for _, s := range rc.spans {
		if s.trace() == trace && s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// one returns the one span of trace named name, failing t when there is not exactly one.
func (rc *otlpReceiver) one(t *testing.T, trace, name string) receivedSpan {
	t.Helper()
	got := rc.named(trace, name)
	if len(got) != 1 {
		t.Fatalf("%d %s spans in trace %s, want 1 (all: %s)", len(got), name, trace, rc.summary())
	}
	return got[0]
}

func (rc *otlpReceiver) summary() string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var b strings.Builder
	for _, s := range rc.spans {
		fmt.Fprintf(&b, "\n  %s %s trace=%s span=%s parent=%s links=%d", s.service, s.Name, s.trace(), s.id(), s.parent(), len(s.Links))
	}
	return b.String()
}

// traceUpstream answers 503 (Retry-After: 0) to the first n requests of each path and 200
// after, and keeps the traceparent of every request, by path.
type traceUpstream struct {
	mu     sync.Mutex
	seen   map[string][]string
	failed map[string]int
	n      int
}

func newTraceUpstream(t *testing.T, n int) (*traceUpstream, string) {
	u := &traceUpstream{seen: map[string][]string{}, failed: map[string]int{}, n: n}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		defer u.mu.Unlock()
		u.seen[r.URL.Path] = append(u.seen[r.URL.Path], r.Header.Get("Traceparent"))
		if strings.HasPrefix(r.URL.Path, "/work") && u.failed[r.URL.Path] < u.n {
			u.failed[r.URL.Path]++
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	return u, srv.URL
}

func (u *traceUpstream) traceparents(path string) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.seen[path]...)
}

// tracingConfig is an ingress's or worker's config with tracing to rc, a queue "jobs" that
// every POST /work is deferred to, and a limit on /fwd, which is forwarded.
func tracingConfig(listen, admin, upstream, redisURL, natsURL, otlp string) string {
	return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
redis: { url: %q }
nats: { url: %q }
shutdown_timeout: 3s
tracing: { otlp: %q }
queues:
  - name: jobs
    rate: 100/s
    backoff: { initial: 10ms, max: 50ms }
rules:
  - name: deferred
    match: { methods: [POST], path: /work }
    action: enqueue
    queue: jobs
  - name: forwarded
    match: { path: /fwd }
    algorithm: gcra
    limit: 100
    period: 1s
`, listen, admin, upstream, redisURL, natsURL, otlp)
}

// A request deferred with the client's traceparent, delivered after one 503 and a retry,
// makes one trace: the ingress's request span (the client's span's child) with its decision
// and enqueue spans, and, from the worker, an admission span per pass and two delivery spans,
// each linked to the enqueue span; the upstream receives each delivery span's traceparent.
// Both processes flush their spans when they stop.
func TestTraceThroughTheQueue(t *testing.T) {
	rdb, ns := testenv.Redis(t), testenv.NATS(t)
	rc := newOTLPReceiver(t)
	up, upURL := newTraceUpstream(t, 1)
	dir := t.TempDir()
	listen := freeAddr(t)
	in := start(t, dir, tracingConfig(listen, freeAddr(t), upURL, rdb.URL(), ns.URL, rc.url))
	stopWorker := runWorker(t, dir, tracingConfig(listen, freeAddr(t), upURL, rdb.URL(), ns.URL, rc.url))
	waitReady(t, in)

	const traceID, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	req, _ := http.NewRequest(http.MethodPost, "http://"+in.listen+"/work", strings.NewReader(`{"n":1}`))
	req.Header.Set("Traceparent", "00-"+traceID+"-"+clientSpan+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var accepted struct{ ID string }
	err = json.NewDecoder(resp.Body).Decode(&accepted)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST /work = %d (%v), want 202", resp.StatusCode, err)
	}
	waitJobState(t, in.listen, accepted.ID, "succeeded", 20*time.Second)
	stopWorker()
	in.stop()

	request := rc.one(t, traceID, "sluice.request")
	if request.parent() != clientSpan || request.service != "sluice-ingress" {
		t.Errorf("request span: parent %s service %s, want the client's span %s, sluice-ingress", request.parent(), request.service, clientSpan)
	}
	decide := rc.one(t, traceID, "sluice.decide")
	if decide.parent() != request.id() || decide.attr("sluice.decision") != "defer" || decide.attr("sluice.queue") != "jobs" {
		t.Errorf("decide span: parent %s decision %q queue %q, want %s, defer, jobs", decide.parent(),
			decide.attr("sluice.decision"), decide.attr("sluice.queue"), request.id())
	}
	enqueue := rc.one(t, traceID, "sluice.enqueue")
	if enqueue.parent() != request.id() || enqueue.attr("sluice.job") != accepted.ID {
		t.Errorf("enqueue span: parent %s job %q, want %s, %s", enqueue.parent(), enqueue.attr("sluice.job"), request.id(), accepted.ID)
	}

	deliveries := rc.named(traceID, "sluice.deliver")
	if len(deliveries) != 2 {
		t.Fatalf("%d delivery spans, want 2:%s", len(deliveries), rc.summary())
	}
	sent := up.traceparents("/work")
	if len(sent) != 2 {
		t.Fatalf("the upstream got %d deliveries, want 2", len(sent))
	}
	for i, d := range deliveries {
		want := []string{"503", "200"}[i]
		if d.attr("http.response.status_code") != want || d.attr("sluice.queue") != "jobs" ||
			d.attr("sluice.attempt") == "" || d.attr("sluice.wait_seconds") == "" || d.service != "sluice-worker" {
			t.Errorf("delivery %d: status %q queue %q attempt %q wait %q service %s, want %s, jobs, an attempt, a wait, sluice-worker",
				i, d.attr("http.response.status_code"), d.attr("sluice.queue"), d.attr("sluice.attempt"), d.attr("sluice.wait_seconds"), d.service, want)
		}
		if len(d.Links) != 1 || hex.EncodeToString(d.Links[0].TraceId) != traceID || hex.EncodeToString(d.Links[0].SpanId) != enqueue.id() {
			t.Errorf("delivery %d links %v, want one to the enqueue span %s", i, d.Links, enqueue.id())
		}
		if d.parent() != enqueue.id() {
			t.Errorf("delivery %d: parent %s, want the enqueue span %s", i, d.parent(), enqueue.id())
		}
		if tp := "00-" + traceID + "-" + d.id() + "-01"; sent[i] != tp {
			t.Errorf("delivery %d reached the upstream with traceparent %q, want its span's %q", i, sent[i], tp)
		}
	}
	admissions := rc.named(traceID, "sluice.admission")
	if len(admissions) != 2 {
		t.Fatalf("%d admission spans, want one per pass (2):%s", len(admissions), rc.summary())
	}
	for i, a := range admissions {
		if a.attr("sluice.admission") != "go" || len(a.Events) == 0 || a.parent() != enqueue.id() || a.attr("sluice.queue") != "jobs" {
			t.Errorf("admission %d: %q with %d events, parent %s, queue %q; want go, an event per admitter, %s, jobs",
				i, a.attr("sluice.admission"), len(a.Events), a.parent(), a.attr("sluice.queue"), enqueue.id())
		}
	}
}

// A forwarded request continues the client's trace: the upstream receives a traceparent of
// the client's trace id whose parent is Sluice's forward span, a child of its request span.
func TestTraceForwarded(t *testing.T) {
	rdb, ns := testenv.Redis(t), testenv.NATS(t)
	rc := newOTLPReceiver(t)
	up, upURL := newTraceUpstream(t, 0)
	in := start(t, t.TempDir(), tracingConfig(freeAddr(t), freeAddr(t), upURL, rdb.URL(), ns.URL, rc.url))
	waitReady(t, in) // its queues open in the background: not while NATS shuts down

	const traceID, clientSpan = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	req, _ := http.NewRequest(http.MethodGet, "http://"+in.listen+"/fwd", nil)
	req.Header.Set("Traceparent", "00-"+traceID+"-"+clientSpan+"-01")
	req.Header.Set("Tracestate", "vendor=x")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /fwd = %d, want 200", resp.StatusCode)
	}
	in.stop()

	sent := up.traceparents("/fwd")
	if len(sent) != 1 || !strings.HasPrefix(sent[0], "00-"+traceID+"-") || strings.Contains(sent[0], clientSpan) {
		t.Fatalf("the upstream got traceparent %q, want the client's trace %s under a span of Sluice's", sent, traceID)
	}
	request := rc.one(t, traceID, "sluice.request")
	forward := rc.one(t, traceID, "sluice.forward")
	decide := rc.one(t, traceID, "sluice.decide")
	if request.parent() != clientSpan || forward.parent() != request.id() || decide.parent() != request.id() {
		t.Errorf("parents: request %s forward %s decide %s, want %s, %s, %s", request.parent(), forward.parent(),
			decide.parent(), clientSpan, request.id(), request.id())
	}
	if want := "00-" + traceID + "-" + forward.id() + "-01"; sent[0] != want {
		t.Errorf("the upstream got %q, want the forward span's %q", sent[0], want)
	}
	if forward.attr("http.response.status_code") != "200" || decide.attr("sluice.decision") != "forward" {
		t.Errorf("forward status %q, decision %q; want 200, forward", forward.attr("http.response.status_code"), decide.attr("sluice.decision"))
	}
	if forward.TraceState != "vendor=x" {
		t.Errorf("forward span's tracestate %q, want the client's vendor=x", forward.TraceState)
	}
}

// runWorker runs app.Worker with the config text cfg until the returned stop is called (or the
// test ends), and fails the test when Run returns an error.
func runWorker(t *testing.T, dir, cfg string) (stop func()) {
	t.Helper()
	path := filepath.Join(dir, "worker.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Worker{ConfigPath: path, Logger: testLogger()}.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("worker: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitReady waits until the ingress's /readyz answers 200: its queues are open.
func waitReady(t *testing.T, in *running) {
	t.Helper()
	testenv.WaitFor(t, 20*time.Second, "the ingress's queues to open (/readyz)", func() bool {
		resp, err := http.Get("http://" + in.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// waitJobState waits until job id's state (GET /v1/jobs/{id}) is want.
func waitJobState(t *testing.T, listen, id, want string, timeout time.Duration) {
	t.Helper()
	testenv.WaitFor(t, timeout, "job "+id+" to be "+want, func() bool {
		resp, err := http.Get("http://" + listen + "/v1/jobs/" + id)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var st struct{ State string }
		return json.NewDecoder(resp.Body).Decode(&st) == nil && st.State == want
	})
}
