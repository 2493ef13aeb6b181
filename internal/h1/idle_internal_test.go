package h1

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// TestIdleConnectionsExpire: a connection idle for IdleTimeout is not used again, and one left
// behind by a steadier load is closed when another comes back.
func TestIdleConnectionsExpire(t *testing.T) {
	var mu sync.Mutex
	states := map[http.ConnState]int{}
	closed := make(chan struct{}, 8)
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		mu.Lock()
		states[st]++
		mu.Unlock()
		if st == http.StateClosed {
			closed <- struct{}{}
		}
	}
	s.Start()
	defer s.Close()
	now := time.Unix(1000, 0)
	c := &Client{Dial: (&net.Dialer{}).DialContext, now: func() time.Time { return now }}
	defer c.CloseIdleConnections()
	get := func() {
		t.Helper()
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, s.URL, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	get()
	now = now.Add(IdleTimeout)
	get() // the first connection is too old: closed, and a new one dialed
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the expired connection was not closed")
	}
	mu.Lock()
	if states[http.StateNew] != 2 {
		t.Fatalf("%d connections, want 2", states[http.StateNew])
	}
	mu.Unlock()

	// Two connections in the idle set; the load then needs one at a time, so the older one is
	// never taken again and is closed once it has been idle for IdleTimeout.
	req1, _ := http.NewRequest(http.MethodGet, s.URL, nil)
	r1, err := c.Do(req1) // the idle one
	if err != nil {
		t.Fatal(err)
	}
	req2, _ := http.NewRequest(http.MethodGet, s.URL, nil)
	r2, err := c.Do(req2) // a new one
	if err != nil {
		t.Fatal(err)
	}
	r1.Body.Close()
	r2.Body.Close()
	for range 3 {
		now = now.Add(IdleTimeout / 2)
		get()
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the connection left idle was not closed")
	}
	c.mu.Lock()
	n := len(c.idle[hostPort(req1.URL)])
	c.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d idle connections, want 1", n)
	}
}
