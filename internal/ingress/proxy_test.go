package ingress

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// publicServer serves f's handler on a real loopback listener.
func publicServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s
}

// TestForwardHeaders checks what the upstream receives: hop-by-hop headers removed (those
// named by Connection too), X-Forwarded-For and Forwarded appended to, the rest kept; and
// that the upstream's answer comes back with the rate-limit headers set over its own.
func TestForwardHeaders(t *testing.T) {
	f := newFixture(t, `
rules:
  - { name: all, match: { path: /* }, algorithm: fixed_window, limit: 100, period: 1m }
`, Options{})
	pub := publicServer(t, f.handler)
	req, _ := http.NewRequest("POST", pub.URL+"/api/orders?id=7", strings.NewReader(`{"n":1}`))
	req.Header.Set("Connection", "X-Hop")
	req.Header.Set("X-Hop", "secret")
	req.Header.Set("Te", "gzip")
	req.Header.Set("Proxy-Authorization", "Basic eA==")
	req.Header.Set("Upgrade", "foo")
	req.Header.Set("X-Forwarded-For", "198.51.100.1")
	req.Header.Set("Forwarded", "for=198.51.100.1")
	req.Header.Set("X-Custom", "kept")
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	e := readEchoed(t, res)
	for _, h := range []string{"X-Hop", "Te", "Proxy-Authorization", "Upgrade"} {
		if v := e.Header.Get(h); v != "" {
			t.Errorf("upstream got hop-by-hop %s: %q", h, v)
		}
	}
	if got := e.Header.Get("X-Forwarded-For"); got != "198.51.100.1, 127.0.0.1" {
		t.Errorf("X-Forwarded-For %q, want the client's chain with the peer appended", got)
	}
	if got := e.Header.Get("Forwarded"); !strings.HasPrefix(got, "for=198.51.100.1, for=127.0.0.1;host=") {
		t.Errorf("Forwarded %q, want the client's element and this hop's", got)
	}
	if e.Header.Get("X-Custom") != "kept" || e.Header.Get("Content-Type") != "application/json" || e.Body != `{"n":1}` {
		t.Errorf("upstream got %+v", e)
	}
	if e.Method != "POST" || e.Path != "/api/orders" || e.Query != "id=7" {
		t.Errorf("upstream got %s %s?%s", e.Method, e.Path, e.Query)
	}
	if res.Header.Get("X-Upstream") != "yes" || readPolicy(t, res.Header).name != "all" {
		t.Errorf("response headers %v", res.Header)
	}
}

// TestForwardOverridesUpstreamHeaders checks that an upstream's own rate-limit headers do not
// reach the client beside the ingress's.
func TestForwardOverridesUpstreamHeaders(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("RateLimit-Policy", `"upstream";q=1;w=1`)
		w.Header().Set("RateLimit", `"upstream";r=0;t=1`)
		w.Header().Set("X-RateLimit-Remaining", "0")
		w.WriteHeader(201)
	}))
	defer up.Close()
	s, err := New(parseConfig(t, up.URL, `
rules:
  - { name: mine, algorithm: fixed_window, limit: 10, period: 1m }
`), Options{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	res := serve(s.Handler(), httptestRequest("GET", "/x", "192.0.2.1:1"))
	if res.StatusCode != 201 {
		t.Fatalf("status %d, want the upstream's 201", res.StatusCode)
	}
	if p := readPolicy(t, res.Header); p.name != "mine" || p.r != 9 || len(res.Header.Values("RateLimit")) != 1 {
		t.Fatalf("policy %+v, headers %v", p, res.Header)
	}
}

// TestForwardStreams checks that request and response bodies stream through: the upstream
// sees the first part of the body before the client sent the rest, and the client sees the
// first part of the answer before the upstream wrote the rest. (Each direction in turn: an
// HTTP/1 server reads the whole request before it answers.)
func TestForwardStreams(t *testing.T) {
	gotFirst := make(chan string, 1)
	sendSecond := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		br := bufio.NewReader(r.Body)
		line, _ := br.ReadString('\n')
		gotFirst <- line
		rest, _ := io.ReadAll(br)
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(200)
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		<-sendSecond
		io.WriteString(w, "second:"+string(rest))
	}))
	defer up.Close()
	s, err := New(parseConfig(t, up.URL, `
rules:
  - { name: all, algorithm: fixed_window, limit: 10, period: 1m }
`), Options{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pub := publicServer(t, s.Handler())

	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", pub.URL+"/stream", pr)
	type result struct {
		res *http.Response
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := http.DefaultClient.Do(req)
		done <- result{res, err}
	}()
	io.WriteString(pw, "part one\n")
	select {
	case line := <-gotFirst:
		if line != "part one\n" {
			t.Fatalf("upstream read %q", line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream never saw the first part of a streamed body")
	}
	io.WriteString(pw, "part two")
	pw.Close()
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		close(sendSecond)
		t.Fatal("no response headers before the upstream finished its body")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.res.Body.Close()
	br := bufio.NewReader(r.res.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	if readPolicy(t, r.res.Header).name != "all" {
		t.Fatal("no rate-limit headers on a streamed response")
	}
	close(sendSecond)
	rest, _ := io.ReadAll(br)
	if string(rest) != "second:part two" {
		t.Fatalf("rest %q", rest)
	}
}

// TestUpstreamFailures checks 502 for an upstream that cannot be reached and 504 for one that
// does not answer in time, as problem+json, with the rate-limit headers kept.
func TestUpstreamFailures(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now

	reg := prometheus.NewRegistry()
	s, err := New(parseConfig(t, dead, `
rules:
  - { name: all, algorithm: fixed_window, limit: 10, period: 1m }
`), Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	res := serve(s.Handler(), httptestRequest("GET", "/x", "192.0.2.1:1"))
	readProblem(t, res, http.StatusBadGateway)
	if readPolicy(t, res.Header).r != 9 {
		t.Fatal("rate-limit headers lost on a 502")
	}
	if got := metric(t, reg, "sluice_upstream_errors_total"); got != 1 {
		t.Fatalf("upstream errors %v, want 1", got)
	}
	if got := metric(t, reg, "sluice_requests_total", "code", "502"); got != 1 {
		t.Fatalf("requests{code=502} %v, want 1", got)
	}

	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
	}))
	defer slow.Close()
	defer close(release)
	s2, err := New(parseConfig(t, slow.URL, "rules: []\n"), Options{UpstreamTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	readProblem(t, serve(s2.Handler(), httptestRequest("GET", "/x", "192.0.2.1:1")), http.StatusGatewayTimeout)
}

// TestBadRequests checks the problem+json answers to requests the ingress refuses.
func TestBadRequests(t *testing.T) {
	f := newFixture(t, `
queues:
  - { name: jobs, rate: 10/s, target: "POST http://127.0.0.1:1/x" }
rules: []
`, Options{})
	readProblem(t, f.do("CONNECT", "/x", nil), http.StatusMethodNotAllowed)
	readProblem(t, f.do("TRACE", "/x", nil), http.StatusMethodNotAllowed)
	r := httptestRequest("GET", "/x", "192.0.2.1:1")
	r.Method = "GE(T"
	readProblem(t, serve(f.handler, r), http.StatusBadRequest)
	r = httptestRequest("GET", "/x", "192.0.2.1:1")
	r.URL.Path = "x" // not absolute, as "OPTIONS *" or a hand-built request
	readProblem(t, serve(f.handler, r), http.StatusBadRequest)
	// The job API routes only its methods.
	readProblem(t, f.do("DELETE", "/v1/jobs/abc", nil), http.StatusMethodNotAllowed)
	readProblem(t, f.do("GET", "/v1/queues/jobs/jobs", nil), http.StatusMethodNotAllowed)
	// Without a queue layer, deferral and the job API answer 503 and 404.
	readProblem(t, f.do("POST", "/v1/queues/jobs/jobs", strings.NewReader("x")), http.StatusServiceUnavailable)
	readProblem(t, f.do("GET", "/v1/jobs/abc", nil), http.StatusNotFound)
	readProblem(t, f.do("POST", "/v1/queues/nope/jobs", strings.NewReader("x")), http.StatusNotFound)
}

// TestNoUpstream checks the answer of a Server whose config has no upstream.
func TestNoUpstream(t *testing.T) {
	s, err := New(parseConfig(t, "http://127.0.0.1:1", "rules: []\n"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := parseConfig(t, "http://127.0.0.1:1", "rules: []\n")
	cfg.Upstream = ""
	if err := s.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	readProblem(t, serve(s.Handler(), httptestRequest("GET", "/x", "192.0.2.1:1")), http.StatusBadGateway)
}
