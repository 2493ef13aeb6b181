package admin

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
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

// opsEnv is a real admin server with the queue endpoints and the operating API over real
// JetStream, serving on a loopback listener.
type opsEnv struct {
	addr  string // host:port of the admin listener
	qs    *queue.Queues
	reg   *prometheus.Registry
	cfg   atomic.Pointer[config.Config]
	jobID string
}

// newOpsEnv serves the admin API of the queue "orders" (fair, keyed by X-Tenant) with token
// ("" for none) on 127.0.0.1, and publishes one job.
func newOpsEnv(t *testing.T, token string, setup func(*Server)) *opsEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	js, err := jetstream.New(testenv.Connect(t, testenv.NATS(t).URL))
	if err != nil {
		t.Fatal(err)
	}
	e := &opsEnv{reg: prometheus.NewRegistry()}
	if e.qs, err = queue.New(ctx, js, queue.Options{Prefix: testenv.Name(t)}); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("t.yaml", []byte("queues:\n  - { name: orders, rate: 5/s, tenant: 'header:X-Tenant', fair: true }\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	e.cfg.Store(cfg)
	if err := e.qs.Provision(ctx, []queue.Spec{{Name: "orders", MaxDepth: 1000}}); err != nil {
		t.Fatal(err)
	}
	rc, err := e.qs.Publish(ctx, &queue.Job{Queue: "orders", Direct: true, Body: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	e.jobID = rc.ID

	s := New("127.0.0.1:0", e.reg)
	queues := &Queues{Info: e.qs, Config: e.cfg.Load, Controls: e.qs.Controls, Tenant: e.qs.Tenant}
	queues.Mount(s)
	if err := (&Ops{Q: e.qs, Queues: queues, Token: token, Gatherer: e.reg}).Mount(s, e.reg); err != nil {
		t.Fatal(err)
	}
	if setup != nil {
		setup(s)
	}
	e.addr = serve(t, s, "127.0.0.1:0")
	return e
}

// serve serves s on a new listener at addr until the test ends, and returns its address.
func serve(t *testing.T, s *Server, addr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	api.Serve(t, "admin", ln.Addr().String())
	t.Cleanup(func() {
		http.DefaultClient.CloseIdleConnections()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// do sends method path to the admin listener with the given Host (the listener's address
// when "") and headers, and returns the status and body.
func (e *opsEnv) do(t *testing.T, method, path, host string, hdr map[string]string, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+e.addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode == http.StatusForbidden && res.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("%s %s: 403 as %q, want application/problem+json", method, path, res.Header.Get("Content-Type"))
	}
	return res.StatusCode, string(b)
}

func (e *opsEnv) paused(t *testing.T) bool {
	t.Helper()
	cs, err := e.qs.Controls(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return cs["orders"].Paused
}

// TestCrossSiteWritesRefused: a form POST from another site's page, or one naming another
// origin, is refused with 403 and does not pause the queue, with no token (the browser is a
// loopback peer) and with one (a token does not make another site's form harmless). The
// same write from the listener's own origin, or from a tool that sends no Origin, passes.
func TestCrossSiteWritesRefused(t *testing.T) {
	const token = "0123456789abcdef-admin"
	for _, tc := range []struct {
		name, token string
	}{{"no token", ""}, {"token", token}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newOpsEnv(t, tc.token, nil)
			auth := map[string]string{}
			if tc.token != "" {
				auth["Authorization"] = "Bearer " + tc.token
			}
			with := func(h map[string]string) map[string]string {
				out := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
				for k, v := range auth {
					out[k] = v
				}
				for k, v := range h {
					out[k] = v
				}
				return out
			}
			for _, h := range []map[string]string{
				{"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
				{"Origin": "http://127.0.0.2:" + port(e.addr)}, // another loopback origin, no Fetch Metadata
				{"Sec-Fetch-Site": "same-site"},                // a sibling subdomain's page
				{"Origin": "null"},                             // a sandboxed frame or a data: URL
				{"Origin": "http://" + e.addr + ".evil.example"},
			} {
				code, body := e.do(t, "POST", "/v1/queues/orders/pause", "", with(h), "x=1")
				if code != http.StatusForbidden {
					t.Errorf("pause with %v: %d %s, want 403", h, code, body)
				}
				if code, body := e.do(t, "DELETE", "/v1/queues/orders/dead-letters", "", with(h), ""); code != http.StatusForbidden {
					t.Errorf("purge with %v: %d %s, want 403", h, code, body)
				}
			}
			if e.paused(t) {
				t.Fatal("a cross-site write paused the queue")
			}
			if n := testenv.Metric(t, e.reg, "sluice_admin_writes_total", "action", "pause", "result", "refused"); n != 5 {
				t.Errorf("refused pauses counted %v, want 5", n)
			}

			// The listener's own origin (the dashboard), and a tool that says nothing, may write.
			if code, body := e.do(t, "POST", "/v1/queues/orders/pause", "", with(map[string]string{
				"Origin": "http://" + e.addr, "Sec-Fetch-Site": "same-origin"}), ""); code != 200 || !e.paused(t) {
				t.Fatalf("same-origin pause: %d %s", code, body)
			}
			if code, body := e.do(t, "POST", "/v1/queues/orders/resume", "", auth, ""); code != 200 || e.paused(t) {
				t.Fatalf("resume without Origin: %d %s", code, body)
			}
			if code, body := e.do(t, "POST", "/v1/queues/orders/pause", "", with(map[string]string{"Sec-Fetch-Site": "none"}), ""); code != 200 {
				t.Fatalf("pause typed into the address bar (Sec-Fetch-Site: none): %d %s", code, body)
			}
		})
	}
}

// TestRebindingHostRefused: a request naming a Host that is not the listener's (what a
// DNS-rebinding page sends) is refused, reads of jobs, dead letters, queues, tenants and the
// dashboard included, token or no token; the probes answer any Host; loopback names and
// admin_hosts are answered, and admin_hosts applies as the config reloads.
func TestRebindingHostRefused(t *testing.T) {
	e := newOpsEnv(t, "", nil)
	p := port(e.addr)
	evil := "rebind.evil.example:" + p
	reads := []string{
		"/v1/queues", "/v1/queues/orders", "/v1/queues/orders/dead-letters", "/v1/jobs/" + e.jobID,
		"/v1/queues/orders/tenants/gold", "/v1/rules", "/ui/",
	}
	for _, path := range reads {
		if code, body := e.do(t, "GET", path, evil, nil, ""); code != http.StatusForbidden || !strings.Contains(body, "admin_hosts") {
			t.Errorf("GET %s for Host %s: %d %s, want 403 naming admin_hosts", path, evil, code, body)
		}
	}
	for _, m := range []struct{ method, path string }{
		{"POST", "/v1/queues/orders/pause"}, {"PATCH", "/v1/queues/orders"},
		{"DELETE", "/v1/queues/orders/dead-letters"}, {"POST", "/v1/queues/orders/dead-letters/replay"},
		{"DELETE", "/v1/jobs/" + e.jobID},
	} {
		if code, body := e.do(t, m.method, m.path, evil, map[string]string{"Content-Type": "application/json"}, `{"rate":"1/s"}`); code != http.StatusForbidden {
			t.Errorf("%s %s for Host %s: %d %s, want 403", m.method, m.path, evil, code, body)
		}
	}
	if e.paused(t) {
		t.Fatal("a rebinding write paused the queue")
	}
	if code, body := e.do(t, "GET", "/v1/jobs/"+e.jobID, "127.0.0.1:"+p, nil, ""); code != 200 || !strings.Contains(body, e.jobID) {
		t.Fatalf("job for the listener's own Host: %d %s", code, body)
	}
	for _, probe := range []string{"/healthz", "/metrics"} {
		if code, _ := e.do(t, "GET", probe, evil, nil, ""); code != 200 {
			t.Errorf("GET %s for Host %s: %d, want 200 (probes answer any name)", probe, evil, code)
		}
	}
	for _, host := range []string{"localhost:" + p, "LOCALHOST", "127.0.0.9:1234", "[::1]:" + p} {
		if code, body := e.do(t, "GET", "/v1/queues/orders", host, nil, ""); code != 200 {
			t.Errorf("Host %s: %d %s, want 200", host, code, body)
		}
	}

	// admin_hosts: a name for any port, or one host:port; read on every request.
	next, err := config.Parse("t.yaml", []byte("admin_hosts: [ops.example, 'sluice.example:"+p+"']\n"+
		"queues:\n  - { name: orders, rate: 5/s, tenant: 'header:X-Tenant', fair: true }\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	e.cfg.Store(next)
	for host, want := range map[string]int{
		"ops.example": 200, "ops.example:" + p: 200, "OPS.example.:" + p: 200, "sluice.example:" + p: 200,
		"sluice.example:1": 403, "sluice.example": 403, evil: 403, "xops.example": 403,
	} {
		if code, body := e.do(t, "GET", "/v1/jobs/"+e.jobID, host, nil, ""); code != want {
			t.Errorf("Host %s with admin_hosts: %d %s, want %d", host, code, body, want)
		}
	}
}

// TestHostIsListenerAddress: a listener on all interfaces answers the address it was reached
// on, and a configured name in admin_listen, but not another address.
func TestHostIsListenerAddress(t *testing.T) {
	s := New("admin.internal:9090", nil)
	s.Handle("GET /v1/x", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for host, want := range map[string]int{
		"10.1.2.3:9090": 200, "10.1.2.3": 200, "admin.internal:9090": 200,
		"10.1.2.4:9090": 403, "[fd00::3]:9090": 403, "internal:9090": 403,
	} {
		r := httptest.NewRequest("GET", "http://"+host+"/v1/x", nil)
		r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 9090}))
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, r)
		if w.Code != want {
			t.Errorf("Host %s on 10.1.2.3:9090: %d, want %d", host, w.Code, want)
		}
	}
}

// TestDashboardNotFramed: the dashboard's pages forbid framing by any page.
func TestDashboardNotFramed(t *testing.T) {
	e := newOpsEnv(t, "", nil)
	for _, path := range []string{"/ui/", "/ui/app.js"} {
		res, err := http.Get("http://" + e.addr + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 || res.Header.Get("X-Frame-Options") != "DENY" ||
			!strings.Contains(res.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
			t.Errorf("GET %s: %d, X-Frame-Options %q, CSP %q", path, res.StatusCode,
				res.Header.Get("X-Frame-Options"), res.Header.Get("Content-Security-Policy"))
		}
	}
}

// TestStalledBodyCutOff: a request whose body stops arriving loses its connection after the
// read timeout instead of holding it forever, and a body over 1 MiB is cut off.
func TestStalledBodyCutOff(t *testing.T) {
	s := New("127.0.0.1:0", nil)
	s.readTimeout = 300 * time.Millisecond
	s.Handle("POST /v1/echo", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			return
		}
		w.Write(b)
	}))
	addr := serve(t, s, "127.0.0.1:0")

	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST /v1/echo HTTP/1.1\r\nHost: "+addr+"\r\nContent-Length: 100\r\n\r\nonly part of it"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	conn.SetReadDeadline(start.Add(5 * time.Second))
	_, err = io.ReadAll(conn) // until the server closes the connection
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the connection with a stalled body was still open after %v", time.Since(start).Round(time.Millisecond))
	}

	res, err := http.Post("http://"+addr+"/v1/echo", "application/octet-stream", strings.NewReader(strings.Repeat("x", maxAdminBody+1)))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a body over 1 MiB: %d, want 413", res.StatusCode)
	}
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}
