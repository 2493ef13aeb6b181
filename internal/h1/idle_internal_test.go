package h1

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// upstream is a loopback net/http server that counts the connections it accepted and those
// closed (by either side), and signals each close.
type upstream struct {
	*httptest.Server
	opened, closed atomic.Int64
	closes         chan struct{}
}

func newUpstream(t *testing.T, h http.HandlerFunc) *upstream {
	t.Helper()
	u := &upstream{closes: make(chan struct{}, 64)}
	u.Server = httptest.NewUnstartedServer(h)
	u.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			u.opened.Add(1)
		case http.StateClosed:
			u.closed.Add(1)
			u.closes <- struct{}{}
		}
	}
	u.Start()
	t.Cleanup(u.Close)
	return u
}

// waitClosed waits until the server has counted n connections closed.
func (u *upstream) waitClosed(t *testing.T, n int64, what string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for u.closed.Load() < n {
		select {
		case <-u.closes:
		case <-deadline:
			t.Fatalf("%s: the server counted %d connections closed, want %d", what, u.closed.Load(), n)
		}
	}
}

// get sends a GET to url on c and reads the answer to its end.
func get(t *testing.T, c *Client, url string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

func (c *Client) idleCount() (n int, armed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len(), c.armed
}

// TestAnExpiredConnectionIsNotTaken: a connection idle for IdleTimeout is closed at its take
// and a new one dialed, even before the sweep comes to it.
func TestAnExpiredConnectionIsNotTaken(t *testing.T) {
	u := newUpstream(t, func(http.ResponseWriter, *http.Request) {})
	now := time.Unix(1000, 0)
	var clock atomic.Pointer[time.Time]
	clock.Store(&now)
	c := &Client{Dial: (&net.Dialer{}).DialContext, now: func() time.Time { return *clock.Load() }}
	t.Cleanup(c.CloseIdleConnections)
	get(t, c, u.URL)
	later := now.Add(DefaultIdleTimeout)
	clock.Store(&later)
	get(t, c, u.URL) // the first connection is too old: closed, and a new one dialed
	u.waitClosed(t, 1, "the expired connection")
	if n := u.opened.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
}

// TestTheSweepClosesIdleConnections: connections left idle, to a host asked again and to one
// no longer asked, are closed by the sweep once idle for IdleTimeout, and the server sees
// them closed; with none left idle the Client keeps no sweep armed and no goroutine.
func TestTheSweepClosesIdleConnections(t *testing.T) {
	a := newUpstream(t, func(http.ResponseWriter, *http.Request) {})
	b := newUpstream(t, func(http.ResponseWriter, *http.Request) {})
	base := runtime.NumGoroutine()
	c := &Client{Dial: (&net.Dialer{}).DialContext, IdleTimeout: 50 * time.Millisecond}
	t.Cleanup(c.CloseIdleConnections)

	// Two connections to a at once, one to b.
	reqs := make([]*http.Response, 2)
	for i := range reqs {
		req, _ := http.NewRequest(http.MethodGet, a.URL, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		reqs[i] = resp
	}
	for _, r := range reqs {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	get(t, c, b.URL)
	if n, armed := c.idleCount(); n != 3 || !armed {
		t.Fatalf("%d idle connections, sweep armed %v; want 3 and true", n, armed)
	}
	a.waitClosed(t, 2, "a's idle connections")
	b.waitClosed(t, 1, "b's idle connection")
	if n, armed := c.idleCount(); n != 0 || armed {
		t.Fatalf("after the sweep: %d idle connections, sweep armed %v; want 0 and false", n, armed)
	}
	c.mu.Lock()
	hosts := len(c.idle)
	c.mu.Unlock()
	if hosts != 0 {
		t.Fatalf("the idle set still lists %d hosts", hosts)
	}
	waitGoroutines(t, base)

	// The Client is as good as new: the next request dials, and its connection is swept too.
	get(t, c, b.URL)
	b.waitClosed(t, 2, "b's second connection")
	if o := a.opened.Load() + b.opened.Load(); o != 4 {
		t.Fatalf("%d connections opened, want 4", o)
	}
	waitGoroutines(t, base)
}

// waitGoroutines waits until the process runs no more goroutines than base.
func waitGoroutines(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines, want at most %d as before:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond) // polling a condition, not standing in for one
	}
}

// TestTheSweepNeverClosesABusyConnection: a connection whose answer is being read, for many
// idle timeouts, is left alone by the sweeps that close the idle ones around it, and is
// swept only once it is idle itself.
func TestTheSweepNeverClosesABusyConnection(t *testing.T) {
	release := make(chan struct{})
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			w.Header().Set("Content-Length", "10")
			w.Write([]byte("12345"))
			w.(http.Flusher).Flush()
			<-release
			w.Write([]byte("67890"))
		}
	})
	var once sync.Once
	let := func() { once.Do(func() { close(release) }) }
	t.Cleanup(let) // before the server's Close, which waits for the handler
	c := &Client{Dial: (&net.Dialer{}).DialContext, IdleTimeout: 30 * time.Millisecond}
	t.Cleanup(c.CloseIdleConnections)
	req, _ := http.NewRequest(http.MethodGet, u.URL+"/slow", nil)
	busy, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 5)
	if _, err := io.ReadFull(busy.Body, first); err != nil {
		t.Fatal(err)
	}
	// Three connections in turn go idle beside it and are swept: the busy one outlives three
	// sweeps that each came more than IdleTimeout after it was taken.
	for i := range int64(3) {
		get(t, c, u.URL+"/fast")
		u.waitClosed(t, i+1, "an idle connection beside the busy one")
	}
	let()
	rest, err := io.ReadAll(busy.Body)
	if err != nil || string(first)+string(rest) != "1234567890" {
		t.Fatalf("the busy connection's answer: %q, %v", string(first)+string(rest), err)
	}
	if n := u.closed.Load(); n != 3 {
		t.Fatalf("%d connections closed while one was busy, want the 3 idle ones", n)
	}
	busy.Body.Close() // now idle: swept in its turn
	u.waitClosed(t, 4, "the formerly busy connection")
	if n := u.opened.Load(); n != 4 {
		t.Fatalf("%d connections, want 4", n)
	}
}

// TestCloseIdleConnectionsClosesThoseInUseAtTheirReturn: CloseIdleConnections closes the idle
// connection at once, and the one whose answer is being read when its body is closed, not
// 90 s later by the sweep; a connection dialed after the call is kept as before.
func TestCloseIdleConnectionsClosesThoseInUseAtTheirReturn(t *testing.T) {
	release := make(chan struct{})
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			w.Header().Set("Content-Length", "10")
			w.Write([]byte("12345"))
			w.(http.Flusher).Flush()
			<-release
			w.Write([]byte("67890"))
		}
	})
	var once sync.Once
	let := func() { once.Do(func() { close(release) }) }
	t.Cleanup(let) // before the server's Close, which waits for the handler
	c := &Client{Dial: (&net.Dialer{}).DialContext}
	t.Cleanup(c.CloseIdleConnections)
	req, _ := http.NewRequest(http.MethodGet, u.URL+"/slow", nil)
	busy, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 5)
	if _, err := io.ReadFull(busy.Body, first); err != nil {
		t.Fatal(err)
	}
	get(t, c, u.URL+"/fast") // a second connection, left idle
	c.CloseIdleConnections()
	u.waitClosed(t, 1, "the idle connection")
	let()
	rest, err := io.ReadAll(busy.Body)
	if err != nil || string(first)+string(rest) != "1234567890" {
		t.Fatalf("the busy connection's answer: %q, %v", string(first)+string(rest), err)
	}
	busy.Body.Close() // read to its end and kept alive: it would go back to the idle set
	u.waitClosed(t, 2, "the connection in use at CloseIdleConnections, at its return")
	if n, armed := c.idleCount(); n != 0 || armed {
		t.Fatalf("%d idle connections, sweep armed %v; want 0 and false", n, armed)
	}
	get(t, c, u.URL+"/fast")
	if n, _ := c.idleCount(); n != 1 || u.opened.Load() != 3 {
		t.Fatalf("after: %d idle connections of %d opened; want the new one kept, of 3", n, u.opened.Load())
	}
}
