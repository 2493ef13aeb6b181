package ingress

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const costYAML = `
rules:
  - name: tokens
    match: {path: /v1/chat}
    key: [header:X-Api-Key]
    algorithm: token_bucket
    limit: 1000
    period: 1h
    cost: json:/max_tokens
    cost_fallback: 100
  - name: bytes
    match: {path: /upload}
    algorithm: fixed_window
    limit: 100
    period: 1h
    cost: body_bytes
  - name: units
    match: {path: /search}
    algorithm: sliding_log
    limit: 10
    period: 1h
    cost: header:X-Query-Cost
`

// Rules charge what a request costs, report units in the rate-limit headers, fall back when a
// cost cannot be read, refuse what no wait would admit with 422, and forward the body whole.
func TestRuleCosts(t *testing.T) {
	for store, mk := range limiters(t) {
		t.Run(store, func(t *testing.T) {
			c := &clock{t: epoch}
			f := newFixture(t, costYAML, Options{Limiter: mk(c.Now), Now: c.Now})
			chat := func(body string) *http.Response {
				return f.do("POST", "/v1/chat", strings.NewReader(body), "X-Api-Key", "k1", "Content-Type", "application/json")
			}
			body := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":400}`
			res := chat(body)
			if got := readEchoed(t, res).Body; got != body {
				t.Fatalf("the upstream got %q, want the body whole %q", got, body)
			}
			if p := readPolicy(t, res.Header); p.q != 1000 || p.r != 600 {
				t.Errorf("after 400 units: policy %+v, want q=1000 r=600", p)
			}
			readEchoed(t, chat(`{"max_tokens":400}`))
			res = chat(`{"max_tokens":300}`) // 200 left
			pb := readProblem(t, res, http.StatusTooManyRequests)
			if pb.ViolatedPolicies[0] != "tokens" {
				t.Errorf("429 names %v", pb.ViolatedPolicies)
			}
			if p := readPolicy(t, res.Header); p.r != 200 {
				t.Errorf("429 reports r=%d, want the 200 units left", p.r)
			}
			res = chat(`{"max_tokens":150}`) // fits in what is left
			if p := readPolicy(t, res.Header); p.r != 50 {
				t.Errorf("after 150 more: r=%d, want 50", p.r)
			}
			readEchoed(t, res)
			// No cost in the body: the fallback (100) is charged, which no longer fits.
			readProblem(t, chat(`{"messages":[]}`), http.StatusTooManyRequests)
			res = f.do("POST", "/v1/chat", strings.NewReader(`{"max_tokens":40}`), "X-Api-Key", "k2")
			if p := readPolicy(t, res.Header); p.r != 960 {
				t.Errorf("another key: r=%d, want 960", p.r)
			}
			readEchoed(t, res)
			res = f.do("POST", "/v1/chat", strings.NewReader(`not json`), "X-Api-Key", "k3")
			if p := readPolicy(t, res.Header); p.r != 900 {
				t.Errorf("a body that is not JSON: r=%d, want 900 (the fallback charged)", p.r)
			}
			readEchoed(t, res)
			// A cost the limit can never admit is refused at once, and charges nothing.
			pb = readProblem(t, f.do("POST", "/v1/chat", strings.NewReader(`{"max_tokens":1001}`), "X-Api-Key", "k4"),
				http.StatusUnprocessableEntity)
			if !strings.Contains(pb.Detail, "costs 1001 units") || !strings.Contains(pb.Detail, "at most 1000") {
				t.Errorf("422 detail %q", pb.Detail)
			}
			res = f.do("POST", "/v1/chat", strings.NewReader(`{"max_tokens":1000}`), "X-Api-Key", "k4")
			if p := readPolicy(t, res.Header); p.r != 0 {
				t.Errorf("after the 422, the whole capacity: r=%d, want 0", p.r)
			}
			readEchoed(t, res)

			// body_bytes: a body without Content-Length is read ahead and forwarded whole.
			r := httptestRequest("POST", "/upload", f.peerAddr)
			r.Body, r.ContentLength = io.NopCloser(strings.NewReader(strings.Repeat("x", 60))), -1
			res = serve(f.handler, r)
			if p := readPolicy(t, res.Header); p.r != 40 {
				t.Errorf("60 bytes of 100: r=%d, want 40", p.r)
			}
			if got := readEchoed(t, res).Body; len(got) != 60 {
				t.Errorf("the upstream got %d bytes, want 60", len(got))
			}
			readProblem(t, f.do("POST", "/upload", strings.NewReader(strings.Repeat("y", 41))), http.StatusTooManyRequests)
			readProblem(t, f.do("POST", "/upload", strings.NewReader(strings.Repeat("y", 101))), http.StatusUnprocessableEntity)

			// header: a missing or malformed header costs the fallback, here the capacity.
			readEchoed(t, f.do("GET", "/search", nil, "X-Query-Cost", "3"))
			res = f.do("GET", "/search", nil, "X-Query-Cost", "-5")
			readProblem(t, res, http.StatusTooManyRequests) // 10 charged where 7 are left
		})
	}
}

// A job carries its cost in the queue's units, read when it is accepted; a job no budget could
// deliver is refused with 422, and a deferred request's cost is read from its body as well.
func TestJobCosts(t *testing.T) {
	f := newQueueFixture(t, `
queues:
  - {name: llm, rate: 60/m, target: 'POST http://upstream.invalid/v1/chat', cost: 'json:/max_tokens', cost_rate: 20000/m, cost_fallback: 4096}
  - {name: plain, rate: 1/s, target: 'POST http://upstream.invalid/x'}
rules:
  - {name: defer, match: {path: /v1/chat}, action: enqueue, queue: llm}
`)
	accepted(t, f.do("POST", "/v1/queues/llm/jobs", strings.NewReader(`{"max_tokens":1500}`), "Content-Type", "application/json"), "llm")
	accepted(t, f.do("POST", "/v1/queues/llm/jobs", strings.NewReader(`{}`)), "llm")
	accepted(t, f.do("POST", "/v1/chat", strings.NewReader(`{"max_tokens":700}`)), "llm")
	pb := readProblem(t, f.do("POST", "/v1/queues/llm/jobs", strings.NewReader(`{"max_tokens":20001}`)), http.StatusUnprocessableEntity)
	if !strings.Contains(pb.Detail, `queue "llm" delivers at most 20000 at once`) {
		t.Errorf("422 detail %q", pb.Detail)
	}
	jobs := f.fetch(t, "llm", 3)
	var costs []int64
	for _, j := range jobs {
		costs = append(costs, j.Cost)
	}
	if len(costs) != 3 || costs[0] != 1500 || costs[1] != 4096 || costs[2] != 700 {
		t.Errorf("job costs %v, want [1500 4096 700] (the second's the fallback)", costs)
	}
	accepted(t, f.do("POST", "/v1/queues/plain/jobs", strings.NewReader(`{"max_tokens":1500}`)), "plain")
	if j := f.fetch(t, "plain", 1); j[0].Cost != 0 {
		t.Errorf("a job of a queue without cost_rate costs %d, want 0 (1)", j[0].Cost)
	}
}

// A rule with cost_from_response charges the estimate on entry, then charges or refunds the
// difference once the upstream says what the request really cost, so the key's budget follows
// what the upstream counted; an answer without a true cost leaves the estimate charged.
func TestRuleCostReconciled(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if used := r.Header.Get("X-True"); used != "" {
			fmt.Fprintf(w, `{"id":"x","usage":{"prompt_tokens":1,"total_tokens":%s}}`, used)
			return
		}
		io.WriteString(w, `{"error":"no usage here"}`)
	}))
	t.Cleanup(up.Close)
	yaml := `
rules:
  - name: tokens
    key: [header:X-Api-Key]
    algorithm: token_bucket
    limit: 1000
    period: 1h
    cost: json:/max_tokens
    cost_from_response: json:/usage/total_tokens
`
	for store, mk := range limiters(t) {
		t.Run(store, func(t *testing.T) {
			c := &clock{t: epoch}
			reg := prometheus.NewRegistry()
			srv, err := New(parseConfig(t, up.URL, yaml), Options{Limiter: mk(c.Now), Now: c.Now, Registerer: reg})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(srv.Close)
			call := func(maxTokens int, used string) policy {
				t.Helper()
				r := httptestRequest("POST", "/v1/chat", "192.0.2.1:1")
				r.Body = io.NopCloser(strings.NewReader(fmt.Sprintf(`{"max_tokens":%d}`, maxTokens)))
				r.ContentLength = -1
				r.Header.Set("X-Api-Key", "k")
				if used != "" {
					r.Header.Set("X-True", used)
				}
				res := serve(srv.Handler(), r)
				io.Copy(io.Discard, res.Body)
				if res.StatusCode != http.StatusOK {
					t.Fatalf("status %d", res.StatusCode)
				}
				return readPolicy(t, res.Header)
			}
			if p := call(500, "100"); p.r != 500 { // the headers report the charge made on entry
				t.Fatalf("after charging 500: r=%d", p.r)
			}
			// 400 refunded: 900 left, of which the next request charges 300.
			if p := call(300, "700"); p.r != 600 {
				t.Fatalf("after the refund of 400 and a charge of 300: r=%d, want 600", p.r)
			}
			// 400 more charged (700 used of 300): 200 left, of which this charges 100.
			if p := call(100, ""); p.r != 100 {
				t.Fatalf("after the charge of 400 more and 100: r=%d, want 100", p.r)
			}
			// No usage in that answer: its 100 stand.
			if p := call(100, "0"); p.r != 0 {
				t.Fatalf("r=%d, want 0", p.r)
			}
			if p := call(40, "0"); p.r != 60 { // the 100 refunded, 40 charged
				t.Fatalf("r=%d, want 60", p.r)
			}
			for _, w := range []struct {
				name   string
				labels []string
				want   float64
			}{
				{"sluice_rule_units_reconciled_total", []string{"rule", "tokens", "direction", "refund"}, 540},
				{"sluice_rule_units_reconciled_total", []string{"rule", "tokens", "direction", "charge"}, 400},
				{"sluice_rule_cost_unreconciled_total", []string{"rule", "tokens"}, 1},
			} {
				if got := metric(t, reg, w.name, w.labels...); got != w.want {
					t.Errorf("%s%v = %v, want %v", w.name, w.labels, got, w.want)
				}
			}
		})
	}
}

// The bytes held by cost read-ahead across 400 stalled requests stay within read_ahead_bytes:
// requests that find the bound held are charged the fallback without their body being read, and each
// request holds one buffer of 1 MiB + 1 byte at most; all of it is given back once answered.
func TestReadAheadBounded(t *testing.T) {
	const each = 1<<20 + 1
	f := newFixture(t, fmt.Sprintf(`
read_ahead_bytes: %d
rules:
  - name: tokens
    match: {path: /v1/chat}
    key: [header:X-Api-Key]
    algorithm: token_bucket
    limit: 1000000
    period: 1h
    cost: json:/max_tokens
    cost_fallback: 4096
`, 3*each), Options{})
	m := f.srv.gate.metrics
	rss0 := rss(t)
	const n = 400
	writers := make([]*io.PipeWriter, n)
	done := make(chan int, n)
	for i := range n {
		pr, pw := io.Pipe()
		writers[i] = pw
		go func() {
			r := httptest.NewRequest("POST", "/v1/chat", pr)
			r.RemoteAddr = f.peerAddr
			r.Header.Set("X-Api-Key", fmt.Sprint("k", i))
			w := httptest.NewRecorder()
			f.handler.ServeHTTP(w, r)
			done <- w.Code
		}()
		go pw.Write([]byte(`{"max_tokens":1,"messages":"`)) // then the body stalls
	}
	deadline := time.Now().Add(10 * time.Second)
	for m.readAhead.held.Load() != 3*each || testutil.ToFloat64(m.readAheadSkips) != n-3 {
		if h := m.readAhead.held.Load(); h > 3*each {
			t.Fatalf("read-ahead holds %d bytes, bound %d", h, 3*each)
		}
		if time.Now().After(deadline) {
			t.Fatalf("read-ahead holds %d bytes (want %d), skipped %v (want %d)",
				m.readAhead.held.Load(), 3*each, testutil.ToFloat64(m.readAheadSkips), n-3)
		}
		time.Sleep(time.Millisecond) // polling a condition, not standing in for one
	}
	grown := rss(t) - rss0
	t.Logf("resident memory grew by %d MiB with %d requests stalled (read-ahead bound %d MiB)", grown>>20, n, 3*each>>20)
	// 400 stalled requests cost goroutines, pipes and recorders besides the read-ahead: 50 MiB,
	// or 300 under the race detector (85 to 130 measured there); a buffer per request of the old
	// doubling growth (2 MiB each) would be 800.
	slack := int64(50 << 20)
	if raceBuild {
		slack = 300 << 20
	}
	if grown > 3*each+slack {
		t.Errorf("resident memory grew by %d MiB: more than the read-ahead bound plus %d MiB", grown>>20, slack>>20)
	}
	for _, pw := range writers {
		go func() {
			pw.Write([]byte(`"}`))
			pw.Close()
		}()
	}
	for range n {
		if code := <-done; code != http.StatusOK {
			t.Errorf("a request answered %d, want 200", code)
		}
	}
	if h := m.readAhead.held.Load(); h != 0 {
		t.Errorf("after every answer the read-ahead holds %d bytes, want 0", h)
	}
}

// A body read ahead for a cost has its own deadline, shorter than read_timeout: one that stalls
// is cut off with 408 and gives its share of the read-ahead bound back.
func TestReadAheadDeadline(t *testing.T) {
	old := readAheadTimeout
	readAheadTimeout = 200 * time.Millisecond
	t.Cleanup(func() { readAheadTimeout = old })
	f := newFixture(t, `
read_timeout: 1m
rules:
  - name: tokens
    match: {path: /v1/chat}
    key: [header:X-Api-Key]
    algorithm: token_bucket
    limit: 1000000
    period: 1h
    cost: json:/max_tokens
`, Options{})
	ing := httptest.NewServer(f.handler)
	t.Cleanup(ing.Close)
	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() })
	go pw.Write([]byte(`{"max_tokens":1,"messages":"`)) // then the body stalls
	req, _ := http.NewRequest("POST", ing.URL+"/v1/chat", pr)
	req.Header.Set("X-Api-Key", "k")
	start := time.Now()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("a stalled body: status %d, want 408", res.StatusCode)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("cut off after %v; the read-ahead deadline is %v (read_timeout 1m)", took, readAheadTimeout)
	}
	deadline := time.Now().Add(5 * time.Second)
	for f.srv.gate.metrics.readAhead.held.Load() != 0 { // given back as the handler returns
		if time.Now().After(deadline) {
			t.Fatalf("the read-ahead holds %d bytes after the answer, want 0", f.srv.gate.metrics.readAhead.held.Load())
		}
		time.Sleep(time.Millisecond) // polling a condition
	}
}

// rss is the process's resident memory in bytes (Linux: VmRSS of /proc/self/status).
func rss(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status:", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Skip("no VmRSS")
	return 0
}
