package h1_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/h1"
)

// server is a real net/http server that counts the connections it accepted.
type server struct {
	*httptest.Server
	conns  atomic.Int64
	closed chan struct{} // a connection closed (its first 16)
}

func newServer(t *testing.T, h http.HandlerFunc) *server {
	t.Helper()
	s := &server{closed: make(chan struct{}, 16)}
	s.Server = httptest.NewUnstartedServer(h)
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			s.conns.Add(1)
		case http.StateClosed:
			select {
			case s.closed <- struct{}{}:
			default:
			}
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func newClient(t *testing.T) *h1.Client {
	t.Helper()
	c := &h1.Client{Dial: (&net.Dialer{}).DialContext}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// call sends method to url with body and returns the answer's status and body, read to its end.
func call(t *testing.T, c *h1.Client, ctx context.Context, method, url, body string, header http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, url, err)
	}
	return resp.StatusCode, string(b)
}

func echo(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "text/plain")
	w.Write([]byte(r.Method + " " + r.URL.RequestURI() + " " + string(b)))
}

func TestKeepsTheConnectionAlive(t *testing.T) {
	s := newServer(t, echo)
	c := newClient(t)
	for i := range 20 {
		body := "job " + strconv.Itoa(i)
		if st, got := call(t, c, context.Background(), http.MethodPost, s.URL+"/q?i="+strconv.Itoa(i), body, nil); st != 200 || got != "POST /q?i="+strconv.Itoa(i)+" "+body {
			t.Fatalf("answer %d: %d %q", i, st, got)
		}
	}
	if n := s.conns.Load(); n != 1 {
		t.Fatalf("20 requests in a row opened %d connections, want 1", n)
	}
}

func TestConcurrentRequestsShareFewConnections(t *testing.T) {
	s := newServer(t, echo)
	c := newClient(t)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				body := strconv.Itoa(g) + "/" + strconv.Itoa(i)
				if st, got := call(t, c, context.Background(), http.MethodPut, s.URL+"/x", body, nil); st != 200 || got != "PUT /x "+body {
					t.Errorf("answer: %d %q", st, got)
				}
			}
		})
	}
	wg.Wait()
	if n := s.conns.Load(); n < 1 || n > 8 {
		t.Fatalf("8 goroutines opened %d connections, want 1 to 8", n)
	}
}

func TestChunkedAnswers(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, _ *http.Request) {
		for i := range 5 {
			w.Write([]byte("part" + strconv.Itoa(i) + ";"))
			w.(http.Flusher).Flush() // no Content-Length: chunked
		}
	})
	c := newClient(t)
	for range 2 {
		req, _ := http.NewRequest(http.MethodGet, s.URL, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
			t.Fatalf("transfer encoding %v, want chunked", resp.TransferEncoding)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != "part0;part1;part2;part3;part4;" {
			t.Fatalf("body %q, %v", b, err)
		}
	}
	if n := s.conns.Load(); n != 1 {
		t.Fatalf("two chunked answers read to their end took %d connections, want 1", n)
	}
}

func TestConnectionCloseIsObeyed(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Connection", "close")
		w.Write([]byte("bye"))
	})
	c := newClient(t)
	for range 3 {
		if st, got := call(t, c, context.Background(), http.MethodGet, s.URL, "", nil); st != 200 || got != "bye" {
			t.Fatalf("answer %d %q", st, got)
		}
	}
	if n := s.conns.Load(); n != 3 {
		t.Fatalf("3 answers with Connection: close took %d connections, want 3", n)
	}
}

func TestABodyLeftUnreadClosesTheConnection(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 100<<10)
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			w.Write(big)
		}
	})
	c := newClient(t)
	req, _ := http.NewRequest(http.MethodGet, s.URL+"/big", nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, err := resp.Body.Read(make([]byte, 1)); err == nil {
		t.Fatal("a read after Close succeeded")
	}
	// The next request cannot use the connection whose answer was left half read.
	if st, _ := call(t, c, context.Background(), http.MethodGet, s.URL+"/small", "", nil); st != 200 {
		t.Fatalf("status %d", st)
	}
	if n := s.conns.Load(); n != 2 {
		t.Fatalf("after a body left unread: %d connections, want 2", n)
	}
	// One read to its end is kept.
	call(t, c, context.Background(), http.MethodGet, s.URL+"/big", "", nil)
	call(t, c, context.Background(), http.MethodGet, s.URL+"/small", "", nil)
	if n := s.conns.Load(); n != 2 {
		t.Fatalf("after bodies read to their end: %d connections, want still 2", n)
	}
}

func TestASlowAnswerEndsAtTheDeadline(t *testing.T) {
	release := make(chan struct{})
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow-body" {
			w.Header().Set("Content-Length", "10")
			w.Write([]byte("12345"))
			w.(http.Flusher).Flush()
		}
		if r.URL.Path == "/fast" {
			return
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	c := newClient(t)

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/slow", strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", "k")
	_, err := c.Do(req)
	var ue *url.Error
	if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &ue) || !ue.Timeout() || ue.Op != "Post" {
		t.Fatalf("a slow answer: %v (%T), want a *url.Error Post of context.DeadlineExceeded", err, err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the timeout of 100ms returned after %v", took)
	}

	// The header in time, the body not: the read fails when the deadline passes.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	req, _ = http.NewRequestWithContext(ctx2, http.MethodGet, s.URL+"/slow-body", nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil || string(b) != "12345" || ctx2.Err() == nil {
		t.Fatalf("a body cut by the deadline: %q, %v (ctx %v)", b, err, ctx2.Err())
	}

	// A cancellation without a deadline ends a request as promptly.
	ctx3, cancel3 := context.WithCancel(context.Background())
	req, _ = http.NewRequestWithContext(ctx3, http.MethodGet, s.URL+"/slow", nil)
	time.AfterFunc(50*time.Millisecond, cancel3)
	if _, err := c.Do(req); !errors.Is(err, context.Canceled) {
		t.Fatalf("a canceled request: %v, want context.Canceled", err)
	}
	// A timed-out connection is not reused: a fresh request works.
	if st, _ := call(t, c, context.Background(), http.MethodGet, s.URL+"/fast", "", nil); st != 200 {
		t.Fatalf("after timeouts: status %d", st)
	}
}

// TestAnIdleConnectionClosedByTheServerIsRetried: net/http's rule, a request with an
// Idempotency-Key (as Sluice sends) goes again on a new connection; a POST without one,
// written before the failure showed, fails with the error.
func TestAnIdleConnectionClosedByTheServerIsRetried(t *testing.T) {
	var got []string
	var mu sync.Mutex
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, string(b))
		mu.Unlock()
	})
	c := newClient(t)
	call(t, c, context.Background(), http.MethodPost, s.URL, "first", http.Header{"Idempotency-Key": {"a"}})
	s.CloseClientConnections() // the kept connection, closed while idle
	if st, _ := call(t, c, context.Background(), http.MethodPost, s.URL, "second", http.Header{"Idempotency-Key": {"b"}}); st != 200 {
		t.Fatalf("status %d", st)
	}
	if n := s.conns.Load(); n != 2 {
		t.Fatalf("connections %d, want 2", n)
	}
	mu.Lock()
	if len(got) != 2 || got[1] != "second" {
		t.Fatalf("the server got %q, want the retried body once", got)
	}
	mu.Unlock()

	s.CloseClientConnections()
	req, _ := http.NewRequest(http.MethodPost, s.URL, strings.NewReader("third"))
	if _, err := c.Do(req); err == nil {
		t.Fatal("a POST without an Idempotency-Key on a closed connection was sent again")
	}
	// A GET is idempotent.
	s.CloseClientConnections()
	if st, _ := call(t, c, context.Background(), http.MethodGet, s.URL, "", nil); st != 200 {
		t.Fatalf("status %d", st)
	}
}

func TestAliveDropsIdleConnections(t *testing.T) {
	s := newServer(t, echo)
	var asked atomic.Int64
	c := &h1.Client{Dial: (&net.Dialer{}).DialContext, Alive: func(net.Conn) bool { asked.Add(1); return false }}
	defer c.CloseIdleConnections()
	call(t, c, context.Background(), http.MethodGet, s.URL, "", nil)
	call(t, c, context.Background(), http.MethodGet, s.URL, "", nil)
	if asked.Load() != 1 || s.conns.Load() != 2 {
		t.Fatalf("Alive asked %d times, %d connections; want 1 and 2", asked.Load(), s.conns.Load())
	}
}

func TestInformationalAnswersAreReadPast(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.WriteHeader(http.StatusAccepted)
		w.Write([]byte("final"))
	})
	c := newClient(t)
	if st, got := call(t, c, context.Background(), http.MethodGet, s.URL, "", nil); st != http.StatusAccepted || got != "final" {
		t.Fatalf("answer %d %q, want 202 final", st, got)
	}
}

func TestRedirectsAreAnswers(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/elsewhere", http.StatusFound)
	})
	c := newClient(t)
	req, _ := http.NewRequest(http.MethodGet, s.URL+"/here", nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/elsewhere" {
		t.Fatalf("answer %d to %q, want the 302 itself", resp.StatusCode, resp.Header.Get("Location"))
	}
}

func TestErrorsAreURLErrors(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	c := newClient(t)
	req, _ := http.NewRequest(http.MethodDelete, "http://u:secret@"+addr+"/x", nil)
	_, err = c.Do(req)
	var ue *url.Error
	if !errors.As(err, &ue) || ue.Op != "Delete" || strings.Contains(ue.URL, "secret") {
		t.Fatalf("a refused dial: %v, want a *url.Error Delete without the password", err)
	}
	req, _ = http.NewRequest(http.MethodGet, "https://"+addr+"/x", nil)
	if _, err := c.Do(req); !errors.Is(err, h1.ErrScheme) {
		t.Fatalf("an https URL: %v, want ErrScheme", err)
	}
}

// TestTheRequestIsWrittenAsNetHTTPWritesIt: the bytes on the wire are net/http's Transport's
// (without compression) for the same request.
func TestTheRequestIsWrittenAsNetHTTPWritesIt(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	raw := make(chan string, 2)
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				br := bufio.NewReader(nc)
				var head bytes.Buffer
				n := 0
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					head.WriteString(line)
					if v, ok := strings.CutPrefix(line, "Content-Length: "); ok {
						n, _ = strconv.Atoi(strings.TrimSpace(v))
					}
					if line == "\r\n" {
						break
					}
				}
				b := make([]byte, n)
				io.ReadFull(br, b)
				raw <- head.String() + string(b)
				io.WriteString(nc, "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
			}()
		}
	}()
	build := func() *http.Request {
		req, _ := http.NewRequest(http.MethodPost, "http://"+l.Addr().String()+"/jobs/7?a=b%20c", bytes.NewReader([]byte(`{"x":1}`)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "k-1")
		req.Header["X-Odd"] = []string{"one", "two"}
		req.Header.Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
		return req
	}
	tr := &http.Transport{DisableCompression: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(build())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	want := <-raw
	c := newClient(t)
	resp, err = c.Do(build())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := <-raw; got != want {
		t.Fatalf("h1 wrote\n%q\nnet/http wrote\n%q", got, want)
	}
	if strings.Contains(want, "Accept-Encoding") {
		t.Fatalf("an Accept-Encoding was added: %q", want)
	}
}

// TestIdleConnectionsBoundedAcrossHosts: past MaxIdleTotal the longest idle connection, of
// whichever host, is closed; the others stay for their next request.
func TestIdleConnectionsBoundedAcrossHosts(t *testing.T) {
	a, b := newServer(t, echo), newServer(t, echo)
	c := &h1.Client{Dial: (&net.Dialer{}).DialContext, MaxIdleTotal: 1}
	defer c.CloseIdleConnections()
	call(t, c, context.Background(), http.MethodGet, a.URL, "", nil)
	call(t, c, context.Background(), http.MethodGet, b.URL, "", nil) // a's idle one goes
	select {
	case <-a.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the longest idle connection was not closed past MaxIdleTotal")
	}
	call(t, c, context.Background(), http.MethodGet, b.URL, "", nil)
	call(t, c, context.Background(), http.MethodGet, a.URL, "", nil)
	if na, nb := a.conns.Load(), b.conns.Load(); na != 2 || nb != 1 {
		t.Fatalf("connections: %d to a, %d to b; want 2 and 1", na, nb)
	}
}
