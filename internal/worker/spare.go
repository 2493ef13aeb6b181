package worker

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/internal/h1"
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
//
// An address no delivery has asked for (warm or dial) in spareIdle, the transport's
// IdleConnTimeout, is let go: its spare closed, not dialed again until a delivery asks for
// it, and the targets that led to it forgotten, so an upstream the worker no longer delivers
// to (a queue removed, its upstream changed) holds no socket. One timer does it, armed only
// while some address or target is known, for when the least recently asked one expires.
type spares struct {
	dialer *net.Dialer
	maxAge time.Duration                         // spareMaxAge
	idle   time.Duration                         // spareIdle
	proxy  func(*http.Request) (*url.URL, error) // the transport's; nil: none

	mu      sync.Mutex
	targets map[string]*spareTarget // by target URL
	asked   map[string]time.Time    // by address: when a delivery last asked for it
	conns   map[string]*spareConn
	dialing map[string]bool
	sweep   *time.Timer // runs sweepIdle; armed exactly while targets or asked is not empty
	armed   bool
	closed  bool
}

// spareTarget is a target URL's address ("host:port" the transport dials for it, "" when
// there is none) and when it was last warmed.
type spareTarget struct {
	addr  string
	asked time.Time
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
	// spareIdle is how long an address no delivery asks for keeps its spare: the transport's
	// and h1's idle timeout.
	spareIdle = h1.DefaultIdleTimeout
	// spareCheckEvery bounds how often warm looks whether the upstream closed a spare.
	spareCheckEvery = 100 * time.Millisecond
	// spareDialTimeout bounds the dial of a spare.
	spareDialTimeout = 10 * time.Second
)

func newSpares(d *net.Dialer, proxy func(*http.Request) (*url.URL, error)) *spares {
	return &spares{dialer: d, maxAge: spareMaxAge, idle: spareIdle, proxy: proxy, targets: map[string]*spareTarget{},
		asked: map[string]time.Time{}, conns: map[string]*spareConn{}, dialing: map[string]bool{}}
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
	s.mu.Lock()
	t := s.targets[target]
	if t == nil {
		s.mu.Unlock()
		t = &spareTarget{addr: s.addrOf(target)}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		s.targets[target] = t
	}
	now := time.Now()
	t.asked = now
	if t.addr != "" {
		s.warmAddrLocked(t.addr, now)
	}
	s.armLocked()
	s.mu.Unlock()
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
	s.mu.Lock()
	s.warmAddrLocked(addr, time.Now())
	s.armLocked()
	s.mu.Unlock()
}

// warmAddrLocked is warmAddr with s.mu held; now is when the delivery asked for addr.
func (s *spares) warmAddrLocked(addr string, now time.Time) {
	if s.closed {
		return
	}
	s.asked[addr] = now
	if s.dialing[addr] {
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
		if _, wanted := s.asked[addr]; !wanted || s.closed || s.conns[addr] != nil {
			c.Close() // let go by the sweep while it was dialed, or not needed
			return
		}
		at := time.Now()
		s.conns[addr] = &spareConn{c: c, at: at, checked: at}
	}()
}

// armLocked sets the sweep, if it is not set, for spareIdle from now: nothing known is older.
func (s *spares) armLocked() {
	if s.armed || s.closed {
		return
	}
	s.armed = true
	if s.sweep == nil {
		s.sweep = time.AfterFunc(s.idle, s.sweepIdle)
		return
	}
	s.sweep.Reset(s.idle)
}

// sweepIdle forgets the targets and addresses no delivery asked for in spareIdle, closes
// those addresses' spares, and sets itself for when the least recently asked of the rest
// expires, or not at all when none is left.
func (s *spares) sweepIdle() {
	now := time.Now()
	var gone []net.Conn
	s.mu.Lock()
	next := time.Duration(-1) // until the next expiry; -1: nothing left
	keep := func(asked time.Time) bool {
		left := s.idle - now.Sub(asked)
		if left <= 0 {
			return false
		}
		if next < 0 || left < next {
			next = left
		}
		return true
	}
	for target, t := range s.targets {
		if !keep(t.asked) {
			delete(s.targets, target)
		}
	}
	for addr, asked := range s.asked {
		if keep(asked) {
			continue
		}
		delete(s.asked, addr)
		if sc := s.conns[addr]; sc != nil {
			gone = append(gone, sc.c)
			delete(s.conns, addr)
		}
	}
	switch {
	case s.closed:
	case next >= 0:
		s.sweep.Reset(next)
	default:
		s.armed = false
	}
	s.mu.Unlock()
	for _, c := range gone {
		c.Close()
	}
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
	if s.sweep != nil {
		s.sweep.Stop()
	}
	s.armed = false
	for addr, sc := range s.conns {
		sc.c.Close()
		delete(s.conns, addr)
	}
}
