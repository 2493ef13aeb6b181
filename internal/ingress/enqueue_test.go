package ingress

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

const deferYAML = `
queues:
  - { name: orders,  rate: 1/s, max_depth: 3, max_body_bytes: 300, target: "POST http://127.0.0.1:1/orders" }
  - { name: reports, rate: 10/s }
rules:
  - name: orders-per-key
    match: { methods: [POST], path: /api/orders }
    key: [header:X-API-Key]
    algorithm: fixed_window
    limit: 1
    period: 1h
    on_limit: enqueue
    queue: orders
  - { name: reports-deferred, match: { methods: [POST], path: /reports }, action: enqueue, queue: reports }
  - { name: catch-all, match: { path: /* }, algorithm: fixed_window, limit: 1000, period: 1h }
`

// queueFixture is a Server deferring to real JetStream on an embedded NATS server.
type queueFixture struct {
	*fixture
	ns  *testenv.NATSServer
	qs  *queue.Queues
	cfg *config.Config
	ctx context.Context
}

func newQueueFixture(t *testing.T, yaml string) *queueFixture {
	t.Helper()
	return newQueueFixtureWith(t, yaml, nil)
}

// newQueueFixtureWith is newQueueFixture with opts changing the Server's options.
func newQueueFixtureWith(t *testing.T, yaml string, opts func(*Options)) *queueFixture {
	t.Helper()
	return newQueueFixtureTimeout(t, yaml, opts, 0)
}

// newQueueFixtureTimeout is newQueueFixtureWith with the queue layer's publish timeout (0: the
// product's, queue.DefaultPublishTimeout, 2s). At 500ms a loaded machine's publish to the
// in-process server timed out into a 503 (TestPriorityNeedsPriorities beside other builds), and
// most of these tests are of what is stored, not of how fast; a test of a publish that fails
// may wait less.
func newQueueFixtureTimeout(t *testing.T, yaml string, opts func(*Options), publishTimeout time.Duration) *queueFixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	ns := testenv.NATS(t)
	js, err := jetstream.New(testenv.Connect(t, ns.URL))
	if err != nil {
		t.Fatal(err)
	}
	qs, err := queue.New(ctx, js, queue.Options{Prefix: testenv.Name(t), PublishTimeout: publishTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		qs.Close(ctx)
	})
	up := upstreamServer(t)
	cfg := parseConfig(t, up.URL, yaml)
	var specs []queue.Spec
	for _, q := range cfg.Queues {
		specs = append(specs, queue.Spec{Name: q.Name, MaxDepth: q.MaxDepth, MaxBytes: q.MaxBytes, MaxBodyBytes: q.MaxBodyBytes,
			DedupeWindow: q.DedupeWindow, Fair: q.Fair, Priorities: q.Priorities})
	}
	if err := qs.Provision(ctx, specs); err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, up: up, reg: prometheus.NewRegistry(), peerAddr: "192.0.2.10:40000", clock: &clock{t: epoch}}
	o := Options{Enqueuer: enqueuer{qs}, Registerer: f.reg, Now: f.clock.Now}
	if opts != nil {
		opts(&o)
	}
	srv, err := New(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	f.srv, f.handler = srv, srv.Handler()
	return &queueFixture{fixture: f, ns: ns, qs: qs, cfg: cfg, ctx: ctx}
}

// enqueuer is *queue.Queues as the ingress uses it, as app's lateQueues is once open.
type enqueuer struct{ *queue.Queues }

func (e enqueuer) TenantID(key []byte) (string, error) { return e.Queues.TenantID(key), nil }

// accepted checks a 202 answer and returns its body.
func accepted(t *testing.T, res *http.Response, queueName string) Accepted {
	t.Helper()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d, want 202; body %s", res.StatusCode, body)
	}
	var a Accepted
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatalf("body %s: %v", body, err)
	}
	if a.ID == "" || a.Queue != queueName || a.State != queue.StateQueued || a.StatusURL != "/v1/jobs/"+a.ID || res.Header.Get("Location") != a.StatusURL {
		t.Fatalf("202 %+v, Location %q", a, res.Header.Get("Location"))
	}
	return a
}

// fetch takes every job waiting in queue name, as a worker would.
func (f *queueFixture) fetch(t *testing.T, name string, want int) []*queue.Job {
	t.Helper()
	c, err := f.qs.Consumer(f.ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	var jobs []*queue.Job
	testenv.WaitFor(t, 10*time.Second, "jobs in the stream", func() bool {
		msgs, err := c.Fetch(f.ctx, want, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			jobs = append(jobs, m.Job)
			m.Ack(f.ctx)
		}
		return len(jobs) >= want
	})
	if len(jobs) != want {
		t.Fatalf("%d jobs in %s, want %d", len(jobs), name, want)
	}
	return jobs
}

// TestDeferOverLimit checks that a request over an on_limit: enqueue rule is stored in the
// rule's queue, as it came, and answered 202 only then.
func TestDeferOverLimit(t *testing.T) {
	f := newQueueFixture(t, deferYAML)
	send := func() *http.Response {
		return f.do("POST", "/api/orders?src=web", strings.NewReader(`{"sku":42}`),
			"X-API-Key", "k1", "Content-Type", "application/json", "Connection", "X-Secret-Hop", "X-Secret-Hop", "1",
			"X-Forwarded-For", "198.51.100.1", "Keep-Alive", "timeout=5", "X-Trace", "abc")
	}
	readEchoed(t, send()) // within the limit: forwarded
	res := send()
	a := accepted(t, res, "orders")
	if p := readPolicy(t, res.Header); p.name != "orders-per-key" || p.r != 0 {
		t.Fatalf("202 policy %+v", p)
	}
	// Its status, by the Location: queued, from the moment of the 202.
	res = f.do("GET", a.StatusURL, nil)
	var st queue.Status
	if err := json.NewDecoder(res.Body).Decode(&st); err != nil || res.StatusCode != 200 || st.ID != a.ID ||
		st.Queue != "orders" || st.State != queue.StateQueued {
		t.Fatalf("GET %s: %d %+v %v", a.StatusURL, res.StatusCode, st, err)
	}
	jobs := f.fetch(t, "orders", 1)
	j := jobs[0]
	if j.ID != a.ID || j.Direct || j.Method != "POST" || j.Path != "/api/orders?src=web" || string(j.Body) != `{"sku":42}` {
		t.Fatalf("job %+v body %q", j, j.Body)
	}
	for _, h := range []string{"Connection", "X-Secret-Hop", "Keep-Alive", "Host", "Content-Length"} {
		if _, ok := j.Header[h]; ok {
			t.Errorf("job keeps %s", h)
		}
	}
	// The forwarding headers are this hop's, as if the request had been forwarded now: the
	// client's chain with the peer appended.
	peer, _, _ := net.SplitHostPort(f.peerAddr)
	if got := j.Header.Values("X-Forwarded-For"); len(got) != 1 || got[0] != "198.51.100.1, "+peer {
		t.Errorf("job X-Forwarded-For %q, want the client's chain and the peer %s", got, peer)
	}
	if fwd := j.Header.Get("Forwarded"); !strings.Contains(fwd, "for=") || j.Header.Get("X-Forwarded-Proto") != "http" {
		t.Errorf("job Forwarded %q, X-Forwarded-Proto %q", fwd, j.Header.Get("X-Forwarded-Proto"))
	}
	if j.Header.Get("X-Trace") != "abc" || j.Header.Get("X-Api-Key") != "k1" || j.Header.Get("Content-Type") != "application/json" {
		t.Errorf("job header %v", j.Header)
	}
	if got := metric(t, f.reg, "sluice_decisions_total", "rule", "orders-per-key", "outcome", "enqueued"); got != 1 {
		t.Errorf("enqueued decisions %v, want 1", got)
	}

	readProblem(t, f.do("GET", "/v1/jobs/0190b5d2-0000-7000-8000-000000000000", nil), http.StatusNotFound)
	readProblem(t, f.do("GET", "/v1/jobs/not%20an%20id", nil), http.StatusNotFound)
}

// TestDeferEveryMatch checks action: enqueue: every matching request goes to the queue.
func TestDeferEveryMatch(t *testing.T) {
	f := newQueueFixture(t, deferYAML)
	ids := map[string]bool{}
	for range 3 {
		ids[accepted(t, f.do("POST", "/reports", strings.NewReader("r")), "reports").ID] = true
	}
	if len(ids) != 3 {
		t.Fatalf("%d distinct ids for 3 requests", len(ids))
	}
	f.fetch(t, "reports", 3)
	// Other methods are not matched and go upstream.
	readEchoed(t, f.do("GET", "/reports", nil))
}

// TestSubmitJob checks direct submission: the body byte-exact with its Content-Type, a job
// for the queue's target.
func TestSubmitJob(t *testing.T) {
	f := newQueueFixture(t, deferYAML)
	body := make([]byte, 256)
	for i := range body {
		body[i] = byte(i)
	}
	res := f.do("POST", "/v1/queues/orders/jobs", bytes.NewReader(body), "Content-Type", "application/octet-stream", "X-Other", "dropped")
	a := accepted(t, res, "orders")
	if readPolicy(t, res.Header).name != "catch-all" {
		t.Fatal("rules apply to the job API too")
	}
	j := f.fetch(t, "orders", 1)[0]
	if j.ID != a.ID || !j.Direct || j.Method != "" || j.Path != "" || !bytes.Equal(j.Body, body) {
		t.Fatalf("job %+v, body byte-exact: %v", j, bytes.Equal(j.Body, body))
	}
	if j.Header.Get("Content-Type") != "application/octet-stream" || j.Header.Get("X-Other") != "" {
		t.Fatalf("job header %v", j.Header)
	}
}

// TestIdempotencyKey checks that a repeated key returns the same job, marked replayed, and
// enqueues nothing new; that a key reused for another body is refused; and that invalid keys
// are refused.
func TestIdempotencyKey(t *testing.T) {
	f := newQueueFixture(t, deferYAML)
	submit := func(key, body string) *http.Response {
		return f.do("POST", "/v1/queues/orders/jobs", strings.NewReader(body), "Idempotency-Key", key)
	}
	res := submit("order-1", "a")
	first := accepted(t, res, "orders")
	if res.Header.Get("Idempotent-Replayed") != "" {
		t.Fatal("first submission marked replayed")
	}
	res = submit("order-1", "a")
	again := accepted(t, res, "orders")
	if again.ID != first.ID || res.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("repeat: id %s (first %s), Idempotent-Replayed %q", again.ID, first.ID, res.Header.Get("Idempotent-Replayed"))
	}
	readProblem(t, submit("order-1", "b"), http.StatusUnprocessableEntity)
	info, err := f.qs.Info(f.ctx, "orders")
	if err != nil || info.Depth != 1 {
		t.Fatalf("depth %d, %v; want one job", info.Depth, err)
	}
	for _, bad := range []string{strings.Repeat("k", 256), "caf\u00e9", "tab\there", ""} {
		readProblem(t, submit(bad, "a"), http.StatusBadRequest)
	}
}

// TestQueueFull checks the 429 of a full queue: Retry-After is the time its backlog takes to
// drain at the queue's rate.
func TestQueueFull(t *testing.T) {
	f := newQueueFixture(t, deferYAML)
	for range 3 { // max_depth 3
		accepted(t, f.do("POST", "/v1/queues/orders/jobs", strings.NewReader("x")), "orders")
	}
	res := f.do("POST", "/v1/queues/orders/jobs", strings.NewReader("x"))
	pb := readProblem(t, res, http.StatusTooManyRequests)
	if res.Header.Get("Retry-After") != "3" || pb.RetryAfter != 3 { // 3 jobs at 1/s
		t.Fatalf("Retry-After %q, problem %+v; want 3", res.Header.Get("Retry-After"), pb)
	}
	// A deferred request finds the queue full too.
	f.do("POST", "/api/orders", nil, "X-API-Key", "k2")
	readProblem(t, f.do("POST", "/api/orders", nil, "X-API-Key", "k2"), http.StatusTooManyRequests)
}

// countingInfo is the queues, counting the reads of a queue's depth.
type countingInfo struct {
	Enqueuer
	infos atomic.Int64
}

func (c *countingInfo) Info(ctx context.Context, name string) (queue.Info, error) {
	c.infos.Add(1)
	return c.Enqueuer.Info(ctx, name)
}

// A flood against a full queue reads its depth from NATS once a second, not once a request:
// each 429 would otherwise cost NATS a round trip.
func TestQueueFullReadsDepthOncePerSecond(t *testing.T) {
	f := newQueueFixture(t, deferYAML)
	for range 3 { // max_depth 3
		accepted(t, f.do("POST", "/v1/queues/orders/jobs", strings.NewReader("x")), "orders")
	}
	counted := &countingInfo{Enqueuer: enqueuer{f.qs}}
	clk := &clock{t: epoch}
	srv, err := New(f.cfg, Options{Enqueuer: counted, Registerer: prometheus.NewRegistry(), Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	flood := func(n int) {
		for range n {
			res := serve(srv.Handler(), httptestRequest("POST", "/v1/queues/orders/jobs", f.peerAddr))
			if pb := readProblem(t, res, http.StatusTooManyRequests); pb.RetryAfter != 3 {
				t.Fatalf("Retry-After %d, want 3", pb.RetryAfter)
			}
		}
	}
	flood(20)
	if n := counted.infos.Load(); n != 1 {
		t.Errorf("20 refusals within a second read the depth %d times, want 1", n)
	}
	clk.Advance(time.Second)
	flood(5)
	if n := counted.infos.Load(); n != 2 {
		t.Errorf("after a second, %d reads in all, want 2", n)
	}
}

// TestSubmitRefused checks 404, 413 and 400 answers of the job API.
func TestSubmitRefused(t *testing.T) {
	f := newQueueFixture(t, deferYAML)
	readProblem(t, f.do("POST", "/v1/queues/nope/jobs", strings.NewReader("x")), http.StatusNotFound)
	readProblem(t, f.do("POST", "/v1/queues/reports/jobs", strings.NewReader("x")), http.StatusNotFound) // no target
	big := strings.Repeat("x", 301)
	pb := readProblem(t, f.do("POST", "/v1/queues/orders/jobs", strings.NewReader(big)), http.StatusRequestEntityTooLarge)
	if !strings.Contains(pb.Detail, "300") {
		t.Errorf("413 detail %q does not say the limit", pb.Detail)
	}
	// Without a Content-Length, the body is cut off as it is read.
	r := httptestRequest("POST", "/v1/queues/orders/jobs", f.peerAddr)
	r.Body, r.ContentLength = io.NopCloser(strings.NewReader(big)), -1
	readProblem(t, serve(f.handler, r), http.StatusRequestEntityTooLarge)
	// A deferred request over the queue's body limit is refused too.
	f.do("POST", "/api/orders", nil, "X-API-Key", "k3")
	readProblem(t, f.do("POST", "/api/orders", strings.NewReader(big), "X-API-Key", "k3"), http.StatusRequestEntityTooLarge)
	if info, _ := f.qs.Info(f.ctx, "orders"); info.Depth != 0 {
		t.Fatalf("depth %d after refusals, want 0", info.Depth)
	}
}

// TestPublishFails checks that a publish that fails (NATS gone) is a 503 with Retry-After,
// never a 202.
func TestPublishFails(t *testing.T) {
	f := newQueueFixtureTimeout(t, deferYAML, nil, 500*time.Millisecond) // each publish waits it out
	f.ns.Server.Shutdown()
	f.ns.Server.WaitForShutdown()
	res := f.do("POST", "/v1/queues/orders/jobs", strings.NewReader("x"))
	pb := readProblem(t, res, http.StatusServiceUnavailable)
	if ra, _ := strconv.Atoi(res.Header.Get("Retry-After")); ra < 1 || pb.RetryAfter < 1 {
		t.Fatalf("Retry-After %q", res.Header.Get("Retry-After"))
	}
	res = f.do("POST", "/reports", strings.NewReader("r"))
	readProblem(t, res, http.StatusServiceUnavailable)
}

// TestJobAPINotDeferred checks that the job API is never deferred: a request to it over an
// on_limit: enqueue rule is rejected with 429 (naming the rule, with its headers) instead.
func TestJobAPINotDeferred(t *testing.T) {
	f := newQueueFixture(t, `
queues:
  - { name: orders, rate: 1/s, target: "POST http://127.0.0.1:1/orders" }
rules:
  - { name: submit, match: { path: /v1/* }, algorithm: fixed_window, limit: 1, period: 1h, on_limit: enqueue, queue: orders }
`)
	accepted(t, f.do("POST", "/v1/queues/orders/jobs", strings.NewReader("a")), "orders")
	res := f.do("POST", "/v1/queues/orders/jobs", strings.NewReader("b"))
	pb := readProblem(t, res, http.StatusTooManyRequests)
	if len(pb.ViolatedPolicies) != 1 || pb.ViolatedPolicies[0] != "submit" || readPolicy(t, res.Header).name != "submit" {
		t.Fatalf("429 %+v, headers %v", pb, res.Header)
	}
	if info, _ := f.qs.Info(f.ctx, "orders"); info.Depth != 1 {
		t.Fatalf("depth %d, want 1", info.Depth)
	}
}

// TestAcceptedJSON checks that the 202's body is byte for byte what encoding/json's Encoder
// writes for it (echo's c.JSON before), for strings that need escaping.
func TestAcceptedJSON(t *testing.T) {
	eta := time.Date(2030, 1, 2, 3, 4, 5, 678000000, time.UTC)
	for i, s := range trickyStrings {
		a := &Accepted{ID: s, Queue: s + "q", State: queue.State(s), StatusURL: JobPath(s)}
		if i%2 == 0 {
			a.ETA = &eta
		}
		var want bytes.Buffer
		if err := json.NewEncoder(&want).Encode(a); err != nil {
			t.Fatal(err)
		}
		if got := append(a.appendJSON(nil), '\n'); !bytes.Equal(got, want.Bytes()) {
			t.Errorf("%q:\n got %s\nwant %s", s, got, want.Bytes())
		}
	}
}
