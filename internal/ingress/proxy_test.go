package ingress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/testenv"
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

// TestForwardInformational checks that a 1xx from the upstream (103 Early Hints) reaches the
// client and does not take the place of the final status, which keeps the upstream's code,
// headers and body, with the rate-limit headers over the upstream's own.
func TestForwardInformational(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Set("RateLimit", `"upstream";r=0;t=1`)
		w.Header().Set("X-Upstream", "yes")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	}))
	defer up.Close()
	reg := prometheus.NewRegistry()
	s, err := New(parseConfig(t, up.URL, `
rules:
  - { name: all, algorithm: fixed_window, limit: 10, period: 1m }
`), Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pub := publicServer(t, s.Handler())
	var early []int
	req, _ := http.NewRequest("GET", pub.URL+"/x", nil)
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			early = append(early, code)
			return nil
		},
	}))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusCreated || string(body) != "made" || res.Header.Get("X-Upstream") != "yes" {
		t.Fatalf("status %d, body %q, headers %v; want the upstream's 201", res.StatusCode, body, res.Header)
	}
	if len(early) != 1 || early[0] != http.StatusEarlyHints {
		t.Fatalf("informational responses %v, want [103]", early)
	}
	if p := readPolicy(t, res.Header); p.name != "all" || p.r != 9 || len(res.Header.Values("RateLimit")) != 1 {
		t.Fatalf("policy %+v, RateLimit %v", p, res.Header.Values("RateLimit"))
	}
	// The request is counted once its handler returns, which may be just after the client
	// has read the whole answer.
	testenv.WaitFor(t, 5*time.Second, "requests{code=201} to be 1", func() bool {
		return metric(t, reg, "sluice_requests_total", "code", "201") == 1
	})
	if got := metric(t, reg, "sluice_requests_total", "code", "201"); got != 1 {
		t.Fatalf("requests{code=201} %v, want 1", got)
	}
}

// TestForwardEncoding checks that the proxy leaves content coding to client and upstream:
// a request without Accept-Encoding reaches the upstream without one (a default transport
// would add gzip, decompress the answer itself and stream it without its Content-Length),
// and a gzip answer to a client that asked for it comes back as the upstream sent it.
func TestForwardEncoding(t *testing.T) {
	const gz = "\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xffJ\xcb\xcf\a\x04\x00\x00\xff\xff!es\x8c\x03\x00\x00\x00" // "foo"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Got-Accept-Encoding", strings.Join(r.Header.Values("Accept-Encoding"), ","))
		if r.Header.Get("Accept-Encoding") == "gzip" {
			w.Header().Set("Content-Encoding", "gzip")
			io.WriteString(w, gz)
			return
		}
		io.WriteString(w, "foo")
	}))
	defer up.Close()
	s, err := New(parseConfig(t, up.URL, "rules: []\n"), Options{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	res := serve(s.Handler(), httptestRequest("GET", "/x", "192.0.2.1:1"))
	body, _ := io.ReadAll(res.Body)
	if got := res.Header.Get("X-Got-Accept-Encoding"); got != "" || string(body) != "foo" || res.Header.Get("Content-Length") != "3" {
		t.Fatalf("no Accept-Encoding: upstream got %q; client got %q, Content-Length %q", got, body, res.Header.Get("Content-Length"))
	}

	r := httptestRequest("GET", "/x", "192.0.2.1:1")
	r.Header.Set("Accept-Encoding", "gzip")
	res = serve(s.Handler(), r)
	body, _ = io.ReadAll(res.Body)
	if res.Header.Get("Content-Encoding") != "gzip" || string(body) != gz {
		t.Fatalf("gzip: Content-Encoding %q, body %q; want the upstream's gzip bytes", res.Header.Get("Content-Encoding"), body)
	}
}

// TestRewrite checks the forwarding headers of the outbound request against what
// ProxyRequest.SetXForwarded and a plain string build make of the same inbound request:
// peers of both families, IPv4-mapped and without a port, prior chains of several lines,
// TLS, and no Host.
func TestRewrite(t *testing.T) {
	target, _ := url.Parse("http://upstream.example:9000/base")
	reference := func(pr *httputil.ProxyRequest) {
		pr.SetURL(target)
		if prior := pr.In.Header["X-Forwarded-For"]; len(prior) > 0 {
			pr.Out.Header["X-Forwarded-For"] = append([]string(nil), prior...)
		}
		pr.SetXForwarded()
		peer, ok := parsePeer(pr.In.RemoteAddr)
		if !ok {
			return
		}
		var b strings.Builder
		for _, p := range pr.In.Header["Forwarded"] {
			b.WriteString(p + ", ")
		}
		b.WriteString("for=")
		if peer.Is6() {
			b.WriteString(`"[` + peer.String() + `]"`)
		} else {
			b.WriteString(peer.String())
		}
		if pr.In.Host != "" {
			b.WriteString(";host=" + sfString(pr.In.Host))
		}
		if pr.In.TLS != nil {
			b.WriteString(";proto=https")
		} else {
			b.WriteString(";proto=http")
		}
		pr.Out.Header["Forwarded"] = []string{b.String()}
	}
	for _, peer := range []string{"192.0.2.1:5000", "[2001:db8::1]:5000", "[::ffff:192.0.2.9]:1", "[fe80::1%eth0]:1", "192.0.2.1", "@"} {
		for _, hdr := range []http.Header{
			{},
			{"X-Forwarded-For": {"198.51.100.1, 198.51.100.2", "198.51.100.3"}, "Forwarded": {"for=198.51.100.1", `for="[2001:db8::7]";proto=https`}},
		} {
			for _, tls := range []bool{false, true} {
				for _, host := range []string{"api.example", ""} {
					in := httptest.NewRequest("GET", "http://api.example/a/b?q=1", nil)
					in.RemoteAddr, in.Header, in.Host = peer, hdr, host
					if !tls {
						in.TLS = nil
					} else {
						in.TLS = &tlsState
					}
					out := func() *http.Request { // as ReverseProxy hands it to Rewrite
						o := in.Clone(in.Context())
						for _, h := range []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
							o.Header.Del(h)
						}
						return o
					}
					got := &httputil.ProxyRequest{In: in, Out: out()}
					want := &httputil.ProxyRequest{In: in, Out: out()}
					rewrite(got, target)
					reference(want)
					if got.Out.URL.String() != want.Out.URL.String() || got.Out.Host != want.Out.Host {
						t.Errorf("peer %s: URL %s host %q, want %s %q", peer, got.Out.URL, got.Out.Host, want.Out.URL, want.Out.Host)
					}
					for _, name := range []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded"} {
						g, w := got.Out.Header[name], want.Out.Header[name]
						if strings.Join(g, "\n") != strings.Join(w, "\n") || (g == nil) != (w == nil) {
							t.Errorf("peer %s, prior %v, tls %v, host %q: %s = %q, want %q", peer, hdr, tls, host, name, g, w)
						}
					}
				}
			}
		}
	}
}

var tlsState = tls.ConnectionState{HandshakeComplete: true}

// TestForwardUpgrade checks that a protocol upgrade (101, as WebSocket uses) is proxied: the
// ingress hijacks the client connection through the writer it gives the proxy, and bytes
// then flow both ways.
func TestForwardUpgrade(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "want Upgrade: echo", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		line, _ := brw.ReadString('\n')
		brw.WriteString("echo: " + line)
		brw.Flush()
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
	conn, err := net.Dial("tcp", strings.TrimPrefix(pub.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusSwitchingProtocols || res.Header.Get("Upgrade") != "echo" {
		t.Fatalf("status %d, headers %v; want 101 with Upgrade: echo", res.StatusCode, res.Header)
	}
	if readPolicy(t, res.Header).name != "all" {
		t.Fatal("no rate-limit headers on the 101")
	}
	io.WriteString(conn, "ping\n")
	line, err := br.ReadString('\n')
	if err != nil || line != "echo: ping\n" {
		t.Fatalf("after the upgrade: %q, %v", line, err)
	}
}

// A client that stops reading a forwarded answer is cut off once a write to it has waited
// read_timeout, and the upstream's connection is let go with it: neither stays pinned
// (issue 30, item 8). The next request on a kept-alive connection is not hit by the old
// deadline.
func TestStalledReaderCutOff(t *testing.T) {
	upDone := make(chan error, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/big" {
			io.WriteString(w, "small")
			return
		}
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		for {
			if _, err := w.Write(chunk); err != nil {
				upDone <- err
				return
			}
		}
	}))
	defer up.Close()
	s, err := New(parseConfig(t, up.URL, "read_timeout: 300ms\nrules: []\n"), Options{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pub := publicServer(t, s.Handler())

	// A kept-alive connection answers a forwarded request, waits longer than read_timeout,
	// and still answers the next one.
	res, err := http.Get(pub.URL + "/small")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	time.Sleep(400 * time.Millisecond) // the time itself is what is tested: past the deadline a write would fail
	res, err = http.Get(pub.URL + "/small")
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("second request on the kept-alive connection: %v %v", res, err)
	}
	res.Body.Close()

	conn, err := net.Dial("tcp", strings.TrimPrefix(pub.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n") // and never read
	select {
	case <-upDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream still streams 10s after the client stopped reading: its connection is pinned")
	}
}
