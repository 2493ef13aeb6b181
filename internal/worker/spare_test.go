//go:build unix

package worker

import (
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// acceptLog is a loopback listener that reports each connection it accepts, and closes at
// once those that drop says to (by their number, from 1) instead of handing them out.
type acceptLog struct {
	net.Listener
	accepted chan net.Conn
	drop     func(n int) bool
	n        int
}

func (l *acceptLog) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.n++
		l.accepted <- c
		if l.drop != nil && l.drop(l.n) {
			c.Close()
			continue
		}
		return c, nil
	}
}

// upstreamFor serves HTTP on a fresh loopback listener that drops the connections drop names
// (nil: none). It returns the base URL, the connections as they are accepted, and each
// request's remote address as it is served.
func upstreamFor(t *testing.T, drop func(n int) bool) (base string, accepted chan net.Conn, served chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	al := &acceptLog{Listener: ln, accepted: make(chan net.Conn, 16), drop: drop}
	served = make(chan string, 16)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served <- r.RemoteAddr
		io.WriteString(w, "ok")
	})}
	go srv.Serve(al)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String(), al.accepted, served
}

// waitParked waits until the spare to base's address is parked, and returns it.
func waitParked(sp *spares, base string) net.Conn {
	addr := strings.TrimPrefix(base, "http://")
	for {
		sp.mu.Lock()
		sc := sp.conns[addr]
		sp.mu.Unlock()
		if sc != nil {
			return sc.c
		}
		runtime.Gosched()
	}
}

func sparesClient(sp *spares) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = sp.dial
	return &http.Client{Transport: t}
}

func get(t *testing.T, c *http.Client, url string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// TestSparesConnectAhead: warming connects to the upstream before any request; the first
// request rides on that connection, and another spare is dialed behind it.
func TestSparesConnectAhead(t *testing.T) {
	base, accepted, served := upstreamFor(t, nil)
	sp := newSpares(&net.Dialer{}, nil)
	t.Cleanup(sp.close)
	sp.warm(base + "/orders")
	var first net.Conn
	select {
	case first = <-accepted: // connected before any request was made
	case <-time.After(5 * time.Second):
		t.Fatal("warm did not connect")
	}
	waitParked(sp, base)
	get(t, sparesClient(sp), base+"/orders?x=1")
	if got, want := <-served, first.RemoteAddr().String(); got != want {
		t.Fatalf("the request came on %s, want the spare %s", got, want)
	}
	select {
	case <-accepted: // the next spare
	case <-time.After(5 * time.Second):
		t.Fatal("no spare dialed behind the one taken")
	}
}

// TestSparesClosedByUpstream: a spare the upstream has closed (as servers close connections
// that send no request) is not used: the request dials its own and succeeds, and warming
// dials a new spare.
func TestSparesClosedByUpstream(t *testing.T) {
	base, accepted, served := upstreamFor(t, func(n int) bool { return n == 1 })
	sp := newSpares(&net.Dialer{}, nil)
	t.Cleanup(sp.close)
	sp.warm(base)
	<-accepted                       // and closed by the upstream
	for open(waitParked(sp, base)) { // until its FIN has arrived
		runtime.Gosched()
	}
	get(t, sparesClient(sp), base+"/")
	second := <-accepted
	if got := <-served; got != second.RemoteAddr().String() {
		t.Fatalf("the request came on %s, want a connection of its own, %s", got, second.RemoteAddr())
	}
	sp.warm(base) // the closed spare is gone; a fresh one is dialed
	select {
	case <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("no new spare after the closed one")
	}
}

// TestSparesExpire: a spare older than maxAge is not used.
func TestSparesExpire(t *testing.T) {
	base, accepted, served := upstreamFor(t, nil)
	sp := newSpares(&net.Dialer{}, nil)
	t.Cleanup(sp.close)
	sp.maxAge = 0
	sp.warm(base)
	spare := <-accepted
	waitParked(sp, base)
	get(t, sparesClient(sp), base+"/")
	if got := <-served; got == spare.RemoteAddr().String() {
		t.Fatal("the request came on the expired spare")
	}
}

// TestSparesAddr: the address dialed for a target: its host and port, the scheme's port, the
// proxy's when one applies, none for what is not an http(s) URL.
func TestSparesAddr(t *testing.T) {
	sp := newSpares(&net.Dialer{}, nil)
	for target, want := range map[string]string{
		"http://api.example:8080/x": "api.example:8080",
		"http://api.example/x":      "api.example:80",
		"https://api.example":       "api.example:443",
		"https://[::1]:8443/":       "[::1]:8443",
		"ftp://api.example/":        "",
		"not a url":                 "",
	} {
		if got := sp.addrOf(target); got != want {
			t.Errorf("addrOf(%q) = %q, want %q", target, got, want)
		}
	}
	proxied := newSpares(&net.Dialer{}, http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy.local:3128"}))
	if got := proxied.addrOf("https://api.example/"); got != "proxy.local:3128" {
		t.Errorf("with a proxy: addrOf = %q, want the proxy's address", got)
	}
}

// connLog is a loopback TCP listener that counts the connections it accepts and reports each
// one the other side closed (its read ends), as a spare's upstream sees them.
type connLog struct {
	addr     string
	accepted atomic.Int64
	closed   chan struct{}
}

func listenConns(t *testing.T) *connLog {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	l := &connLog{addr: ln.Addr().String(), closed: make(chan struct{}, 16)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.accepted.Add(1)
			go func() {
				defer c.Close()
				io.Copy(io.Discard, c) // until the spare is closed
				l.closed <- struct{}{}
			}()
		}
	}()
	return l
}

// waitClose waits for the next connection closed.
func (l *connLog) waitClose(t *testing.T, what string) {
	t.Helper()
	select {
	case <-l.closed:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: its spare was not closed", what)
	}
}

// TestSparesLetGoOfAnAddressNoLongerAsked: the spare to an address no delivery asks for any
// more is closed once spareIdle has passed, and not dialed again, while the spare to one that
// is still asked for stays; with nothing asked for the spares keep no state and no timer; a
// delivery that asks again gets a new spare.
func TestSparesLetGoOfAnAddressNoLongerAsked(t *testing.T) {
	kept, gone := listenConns(t), listenConns(t)
	sp := newSpares(&net.Dialer{}, nil)
	t.Cleanup(sp.close)
	sp.idle = 500 * time.Millisecond
	sp.warm("http://" + kept.addr + "/a")
	sp.warm("http://" + gone.addr + "/b")
	waitParked(sp, "http://"+kept.addr)
	waitParked(sp, "http://"+gone.addr)
	// Deliveries keep asking for kept's address (by another target, and as the transport
	// does), none for gone's.
	asked := time.NewTicker(10 * time.Millisecond)
	defer asked.Stop()
	deadline := time.After(10 * time.Second)
	for closed := false; !closed; {
		select {
		case <-gone.closed:
			closed = true
		case <-asked.C:
			sp.warm("http://" + kept.addr + "/other")
			sp.warmAddr(kept.addr)
		case <-deadline:
			t.Fatal("the spare to the address no longer asked for was not closed")
		}
	}
	asked.Stop()
	select {
	case <-kept.closed:
		t.Fatal("the spare to the address still asked for was closed")
	default:
	}
	kept.waitClose(t, "kept's address, once no longer asked for either")
	sp.mu.Lock()
	left := len(sp.targets) + len(sp.asked) + len(sp.conns) + len(sp.dialing)
	armed := sp.armed
	sp.mu.Unlock()
	if left != 0 || armed {
		t.Fatalf("with nothing asked for: %d targets, addresses, spares and dials left, sweep armed %v", left, armed)
	}
	if a, b := kept.accepted.Load(), gone.accepted.Load(); a != 1 || b != 1 {
		t.Fatalf("connections accepted: %d and %d, want 1 each: a spare let go was dialed again", a, b)
	}
	sp.warm("http://" + gone.addr + "/b") // a delivery asks again
	waitParked(sp, "http://"+gone.addr)
	for deadline := time.Now().Add(10 * time.Second); gone.accepted.Load() != 2; runtime.Gosched() {
		if time.Now().After(deadline) { // the listener accepts after the dial has returned
			t.Fatalf("after a delivery asked again: %d connections accepted, want 2", gone.accepted.Load())
		}
	}
}
