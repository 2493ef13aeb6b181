package worker

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// spares keeps one TCP connection dialed ahead to each address the Pool delivers to, and
// hands it to the HTTP transport when the transport needs a new connection (spares.dial is
// its DialContext). A delivery on a new connection otherwise waits for the TCP handshake
// after its slot, which at a drain's start, when every worker opens its first connection at
// once on a loaded machine, takes longer than a slot may be late (BENCHMARKS.md, "Connections
// dialed ahead"); the upstream then sees it arrive next to the on-time deliveries after it.
//
// A spare carries a request only when the transport needs a new connection; otherwise it
// waits, and is dialed afresh once it is older than spareMaxAge or the upstream has closed it
// (servers close connections that send no request, after their header timeout). So each
// worker holds at most one idle connection per upstream beyond the transport's own, and
// dials one now and then while it delivers. Only the TCP connection is made ahead; TLS, for
// an https upstream, still shakes hands on first use.
type spares struct {
	dialer *net.Dialer
	maxAge time.Duration                         // spareMaxAge
	proxy  func(*http.Request) (*url.URL, error) // the transport's; nil: none

	addrs sync.Map // target URL (string) → address ("host:port") the transport dials for it

	mu      sync.Mutex
	conns   map[string]*spareConn
	dialing map[string]bool
	closed  bool
}

// spareConn is a parked connection.
type spareConn struct {
	c       net.Conn
	at      time.Time // dialed
	checked time.Time // last found open
}

const (
	// spareMaxAge is how long a spare is kept unused before it is dialed afresh.
	spareMaxAge = 30 * time.Second
	// spareCheckEvery bounds how often warm looks whether the upstream closed a spare.
	spareCheckEvery = 100 * time.Millisecond
	// spareDialTimeout bounds the dial of a spare.
	spareDialTimeout = 10 * time.Second
)

func newSpares(d *net.Dialer, proxy func(*http.Request) (*url.URL, error)) *spares {
	return &spares{dialer: d, maxAge: spareMaxAge, proxy: proxy, conns: map[string]*spareConn{}, dialing: map[string]bool{}}
}

// dial is the transport's DialContext: addr's spare when it has an open one (and a new spare
// is dialed behind it), else a connection of its own.
func (s *spares) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if network == "tcp" {
		if c := s.take(addr); c != nil {
			s.warmAddr(addr)
			return c, nil
		}
	}
	c, err := s.dialer.DialContext(ctx, network, addr)
	if err == nil && network == "tcp" {
		s.warmAddr(addr) // the next new connection to addr will not wait
	}
	return c, err
}

// warm makes sure a spare to the address a request to target goes to is there or on its way.
// It returns at once; target is a URL the Pool delivers to ("" does nothing).
func (s *spares) warm(target string) {
	if target == "" {
		return
	}
	if a, ok := s.addrs.Load(target); ok {
		if addr := a.(string); addr != "" {
			s.warmAddr(addr)
		}
		return
	}
	addr := s.addrOf(target)
	s.addrs.Store(target, addr)
	if addr != "" {
		s.warmAddr(addr)
	}
}

// addrOf returns the address the transport dials for a request to target: the proxy's when
// one applies, else target's host and port; "" when target is not an http(s) URL.
func (s *spares) addrOf(target string) string {
	u, err := url.Parse(target)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return ""
	}
	if s.proxy != nil {
		p, err := s.proxy(&http.Request{Method: http.MethodGet, URL: u, Header: http.Header{}})
		if err != nil {
			return ""
		}
		if p != nil {
			u = p
		}
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// warmAddr makes sure a young, open spare to addr is parked or being dialed.
func (s *spares) warmAddr(addr string) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.dialing[addr] {
		return
	}
	if sc := s.conns[addr]; sc != nil {
		if now.Sub(sc.at) < s.maxAge && (now.Sub(sc.checked) < spareCheckEvery || open(sc.c)) {
			sc.checked = now
			return
		}
		sc.c.Close()
		delete(s.conns, addr)
	}
	s.dialing[addr] = true
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), spareDialTimeout)
		c, err := s.dialer.DialContext(ctx, "tcp", addr)
		cancel()
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.dialing, addr)
		if err != nil {
			return // no spare: a delivery that needs a connection dials its own, as without spares
		}
		if s.closed || s.conns[addr] != nil {
			c.Close()
			return
		}
		at := time.Now()
		s.conns[addr] = &spareConn{c: c, at: at, checked: at}
	}()
}

// take removes addr's spare and returns it if it is young and still open; nil otherwise.
func (s *spares) take(addr string) net.Conn {
	s.mu.Lock()
	sc := s.conns[addr]
	delete(s.conns, addr)
	s.mu.Unlock()
	if sc == nil {
		return nil
	}
	if time.Since(sc.at) >= s.maxAge || !open(sc.c) {
		sc.c.Close()
		return nil
	}
	return sc.c
}

// close closes the parked spares; a dial still in flight closes its connection when it
// lands.
func (s *spares) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for addr, sc := range s.conns {
		sc.c.Close()
		delete(s.conns, addr)
	}
}
