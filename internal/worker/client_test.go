//go:build unix

package worker

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/queue"
)

// TestDirectServesPlainHTTPWithoutProxy: the direct path takes plain http:// requests that no
// proxy serves, and leaves https, proxied hosts, 100-continue and upgrades to net/http.
func TestDirectServesPlainHTTPWithoutProxy(t *testing.T) {
	proxied := 0
	d := &direct{proxy: func(r *http.Request) (*url.URL, error) {
		proxied++
		if r.URL.Hostname() == "behind.proxy" {
			return url.Parse("http://proxy:3128")
		}
		return nil, nil
	}}
	for _, c := range []struct {
		url    string
		header http.Header
		want   bool
	}{
		{"http://upstream:8080/x", nil, true},
		{"http://upstream:8080/y", nil, true}, // asked again: no answer kept by host
		{"https://upstream/x", nil, false},
		{"http://behind.proxy/x", nil, false},
		{"http://upstream:8080/x", http.Header{"Expect": {"100-continue"}}, false},
		{"http://upstream:8080/x", http.Header{"Upgrade": {"websocket"}}, false},
	} {
		req, _ := http.NewRequest(http.MethodPost, c.url, nil)
		for k, v := range c.header {
			req.Header[k] = v
		}
		if got := d.serves(req); got != c.want {
			t.Errorf("%s %v: serves %v, want %v", c.url, c.header, got, c.want)
		}
	}
	if proxied != 3 { // the http:// requests without Expect or Upgrade: nothing kept by host
		t.Errorf("the proxy was asked %d times for 3 requests", proxied)
	}
}

// rawUpstream accepts connections and sends each request's bytes, as they arrived, to the
// returned channel; it answers 204 and keeps the connection.
func rawUpstream(t *testing.T) (base string, raw chan string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	raw = make(chan string, 4)
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				br := bufio.NewReader(nc)
				for {
					var msg bytes.Buffer
					n := 0
					for {
						line, err := br.ReadString('\n')
						if err != nil {
							return
						}
						msg.WriteString(line)
						if v, ok := strings.CutPrefix(line, "Content-Length: "); ok {
							n, _ = strconv.Atoi(strings.TrimSpace(v))
						}
						if line == "\r\n" {
							break
						}
					}
					if _, err := io.CopyN(&msg, br, int64(n)); err != nil {
						return
					}
					raw <- msg.String()
					io.WriteString(nc, "HTTP/1.1 204 No Content\r\n\r\n")
				}
			}()
		}
	}()
	return "http://" + l.Addr().String(), raw
}

// TestDirectWritesWhatTheClientWrote: a deferred job's request reaches the upstream byte for
// byte as the Pool's net/http client sends it (headers, body, no Accept-Encoding), and the
// direct path rides on the spare dialed ahead.
func TestDirectWritesWhatTheClientWrote(t *testing.T) {
	base, raw := rawUpstream(t)
	client, sp, d := defaultClient()
	t.Cleanup(func() { client.CloseIdleConnections(); d.h1.CloseIdleConnections(); sp.close() })
	cfg := &QueueConfig{Name: "q", Upstream: base + "/api"}
	j := &queue.Job{ID: "job-1", Method: http.MethodPatch, Path: "/orders?id=7&x=a%20b",
		Header: http.Header{"Content-Type": {"application/octet-stream"}, "X-Multi": {"1", "2"},
			"Traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}},
		IdempotencyKey: "order-1", Body: []byte("binary\x00body\xff")}
	send := func(do func(*http.Request) (*http.Response, error)) string {
		t.Helper()
		req, err := request(context.Background(), cfg, j, 2)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return <-raw
	}
	want := send(client.Do)
	sp.warm(base)
	spare := waitParked(sp, base)
	req, _ := http.NewRequest(http.MethodGet, base, nil)
	if !d.serves(req) {
		t.Fatal("the direct path does not serve a plain http:// upstream")
	}
	if got := send(d.h1.Do); got != want {
		t.Fatalf("the direct path wrote\n%q\nnet/http wrote\n%q", got, want)
	}
	if strings.Contains(want, "Accept-Encoding") {
		t.Fatalf("an Accept-Encoding was added: %q", want)
	}
	// The request took the spare (the client's idle connection is net/http's, not the direct
	// path's), and another was dialed behind it.
	addr := strings.TrimPrefix(base, "http://")
	deadline := time.Now().Add(5 * time.Second)
	for {
		sp.mu.Lock()
		sc := sp.conns[addr]
		sp.mu.Unlock()
		if sc != nil && sc.c != spare {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the direct path did not take the spare, or none was dialed behind it")
		}
		runtime.Gosched()
	}
}

// TestDirectHTTPOff: with the direct path off, a delivery to a plain http:// upstream goes
// through net/http (its Transport reports the connection it got to the request's
// httptrace.ClientTrace; package h1 reports none), and the direct path's idle connection is
// closed at once; on again, deliveries take the direct path.
func TestDirectHTTPOff(t *testing.T) {
	closed := make(chan struct{}, 8)
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) }))
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			closed <- struct{}{}
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	client, sp, d := defaultClient()
	p := &Pool{client: client, spares: sp, direct: d}
	t.Cleanup(func() { client.CloseIdleConnections(); d.h1.CloseIdleConnections(); sp.close() })
	viaNetHTTP := func() bool {
		t.Helper()
		got := false
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { got = true }})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/q", strings.NewReader("job"))
		resp, err := p.do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || string(b) != "ok" {
			t.Fatalf("answer %d %q, %v", resp.StatusCode, b, err)
		}
		return got
	}
	if viaNetHTTP() {
		t.Fatal("with the direct path on, a plain http:// delivery went through net/http")
	}
	p.SetDirectHTTP(false)
	select {
	case <-closed: // the direct path's idle connection
	case <-time.After(10 * time.Second):
		t.Fatal("turning the direct path off left its idle connection open")
	}
	for range 2 {
		if !viaNetHTTP() {
			t.Fatal("with the direct path off, a plain http:// delivery did not go through net/http")
		}
	}
	p.SetDirectHTTP(true)
	if viaNetHTTP() {
		t.Fatal("with the direct path on again, a plain http:// delivery went through net/http")
	}
	(&Pool{client: client}).SetDirectHTTP(false) // a Pool without a direct path: nothing to do
}

// TestDirectIdleTimeoutIsTheTransports: the direct path closes idle connections after the
// net/http transport's IdleConnTimeout, which is net/http's default.
func TestDirectIdleTimeoutIsTheTransports(t *testing.T) {
	client, sp, d := defaultClient()
	t.Cleanup(func() { client.CloseIdleConnections(); d.h1.CloseIdleConnections(); sp.close() })
	tr := client.Transport.(*http.Transport)
	if tr.IdleConnTimeout != 90*time.Second || d.h1.IdleTimeout != tr.IdleConnTimeout {
		t.Fatalf("idle timeouts: net/http %v, direct %v; want both 90s", tr.IdleConnTimeout, d.h1.IdleTimeout)
	}
}

// TestDirectHTTPOffClosesAConnectionInUse: a delivery on the direct path when it is turned off
// (a reload setting worker.direct_http: false) finishes on its connection, which is then
// closed at once, not left idle for the sweep 90 s later; the next delivery goes through
// net/http.
func TestDirectHTTPOffClosesAConnectionInUse(t *testing.T) {
	release := make(chan struct{})
	closed := make(chan string, 8) // the remote addresses of the connections closed
	slowOn := make(chan string, 1) // the remote address /slow came on
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			slowOn <- r.RemoteAddr
			w.Header().Set("Content-Length", "4")
			w.Write([]byte("ok"))
			w.(http.Flusher).Flush()
			<-release
			w.Write([]byte("ok"))
		}
	}))
	s.Config.ConnState = func(c net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			closed <- c.RemoteAddr().String()
		}
	}
	s.Start()
	var once sync.Once
	let := func() { once.Do(func() { close(release) }) }
	t.Cleanup(s.Close)
	t.Cleanup(let) // before the server's Close, which waits for the handler
	client, sp, d := defaultClient()
	p := &Pool{client: client, spares: sp, direct: d}
	t.Cleanup(func() { client.CloseIdleConnections(); d.h1.CloseIdleConnections(); sp.close() })

	req, _ := http.NewRequest(http.MethodPost, s.URL+"/slow", strings.NewReader("job"))
	resp, err := p.do(req)
	if err != nil {
		t.Fatal(err)
	}
	half := make([]byte, 2)
	if _, err := io.ReadFull(resp.Body, half); err != nil {
		t.Fatal(err)
	}
	p.SetDirectHTTP(false) // as the reload does
	let()
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(half)+string(rest) != "okok" {
		t.Fatalf("the delivery in flight: %q, %v", string(half)+string(rest), err)
	}
	resp.Body.Close()
	slow := <-slowOn
	for deadline := time.After(10 * time.Second); ; {
		select {
		case c := <-closed:
			if c != slow {
				continue // not the delivery's (a spare)
			}
		case <-deadline:
			t.Fatal("the direct path's connection in use at the switch-off was kept after its delivery")
		}
		break
	}
	got := false
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { got = true }})
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/fast", strings.NewReader("job"))
	if resp, err = p.do(req); err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if !got {
		t.Fatal("after the switch-off a delivery did not go through net/http")
	}
}
