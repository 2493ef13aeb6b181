// Package h1 sends HTTP/1.1 requests to plain http:// servers from the caller's goroutine.
//
// Model. A Client keeps, per "host:port", up to MaxIdle idle connections (and up to
// MaxIdleTotal in all), each with its own bufio reader and writer. Do takes the most recently
// returned one (or dials), writes the request with Request.Write, flushes, and reads the answer with http.ReadResponse, all in the
// goroutine that called it; the response's Body reads from the same connection. net/http's
// Transport instead hands each request to a connection's write loop and its answer back from
// its read loop: four goroutine hand-offs per request, each of which tends to wake an idle
// processor at a throttled drain's pace (docs/design/worker-costs.md). Here a request parks
// its goroutine only while the network has nothing for it, and the network poller wakes it.
//
// Guarantees.
//   - The request goes out as Request.Write writes it, which is what net/http's Transport
//     writes for a plain http:// request without a proxy: no header added but Host,
//     User-Agent (Go-http-client/1.1, unless set) and the framing (Content-Length or chunked).
//     No Accept-Encoding is added and no answer is decompressed; redirects are answers, not
//     followed. 1xx answers but 101 are read past, as net/http does (at most 5).
//   - A connection goes back to the idle set only when its answer's body was read to EOF and
//     closed, and neither the answer nor the request said Connection: close (nor HTTP/1.0
//     without keep-alive); otherwise Close closes it.
//   - The request's context bounds all of it, the body's reads included: when it ends (its
//     deadline or its cancellation), the connection's deadline is set to the past
//     (context.AfterFunc: no goroutine while it runs). An error once the context has ended is
//     the context's (context.DeadlineExceeded for a timeout), wrapped in *url.Error as
//     http.Client returns it, and a body's read fails only after the context reports it.
//   - A request that failed on a reused connection before any byte of its answer arrived (the
//     server closed the connection while it was idle) is sent once more on a new connection
//     under net/http's rule: when no byte of it was written, or when it can be replayed (no
//     body or Request.GetBody) and is idempotent (GET, HEAD, OPTIONS, TRACE, or an
//     Idempotency-Key or X-Idempotency-Key header). Otherwise Do returns the error.
//
// Costs. One Do on an idle connection: the request's write, its flush (one write system
// call for a request that fits 4 KiB), and the answer's reads; two bufio buffers (4 KiB each)
// per connection, not per request; a Client's lock twice per request.
//
// Idle connections. One idle for IdleTimeout is closed: at its next take, and by the Client's
// sweep, so that a host no longer asked (a queue removed, an upstream moved) is let go too. A
// connection in use is not in the idle set: no sweep closes it. The sweep is one timer per
// Client, not per connection, armed only while the idle set holds a connection; its function
// runs in a goroutine of its own only while it sweeps, so an empty idle set costs no goroutine
// and no armed timer. It fires when the longest idle connection expires and, when Alive is
// set, every second: then Alive is asked, without blocking and under the Client's lock, about
// each connection idle for a second or more, and one the server closed (or wrote to unasked)
// is closed at once, not left in CLOSE_WAIT until its next take. So a connection the server
// closed is closed within two seconds, or at its take if that comes first; that costs a
// wake-up a second while connections are idle, and a system call per connection idle a second
// or more. Without Alive, a closed one is found by the failed request and its one retry, or
// expires. CloseIdleConnections closes the idle connections at once and those in use when
// their bodies are closed, so that after it no connection made before it is used again.
//
// Not handled here, and left to net/http by the caller: https, proxies, HTTP/2, requests
// expecting 100-continue, protocol upgrades.
package h1

import (
	"bufio"
	"container/list"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxIdle is a Client's idle connections per host when MaxIdle is zero.
const DefaultMaxIdle = 64

// DefaultIdleTimeout is a Client's IdleTimeout when that is zero: net/http's DefaultTransport's
// IdleConnTimeout.
const DefaultIdleTimeout = 90 * time.Second

// probeEvery is how often the sweep asks Alive about the connections idle that long.
const probeEvery = time.Second

// max1xx is how many 1xx answers a request may get before its final one (net/http's).
const max1xx = 5

// ErrScheme is returned, wrapped in *url.Error, for a request that is not to an http:// URL.
var ErrScheme = errors.New("h1: only http:// URLs")

// Client sends HTTP/1.1 requests on kept-alive connections. Its zero value is not usable:
// set Dial. A Client is safe for concurrent use; fields must not change after the first Do.
type Client struct {
	// Dial opens a TCP connection to addr ("host:port"); network is "tcp". Required.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// MaxIdle bounds the idle connections kept per host. Zero: DefaultMaxIdle.
	MaxIdle int
	// MaxIdleTotal bounds the idle connections kept across hosts: past it, the longest idle
	// one is closed. Zero: no bound.
	MaxIdleTotal int
	// IdleTimeout is how long a connection may stay idle before it is closed (see the package
	// doc, "Idle connections"). Zero: DefaultIdleTimeout.
	IdleTimeout time.Duration
	// Alive, if set, tells whether an idle connection can carry a request (the server has not
	// closed it), at its take and in the sweep. It must not block, nor call the Client: the
	// sweep calls it with the Client's lock held. Nil: every idle connection is tried.
	Alive func(net.Conn) bool

	now   func() time.Time // nil: time.Now (a test's clock)
	probe time.Duration    // zero: probeEvery (a test's)

	mu   sync.Mutex
	idle map[string][]*conn // by address; the most recently returned last
	lru  list.List          // every idle connection, the longest idle first
	// sweep runs sweepIdle; armed is whether it is set to, which it is exactly while lru
	// holds a connection (or a sweep that will find it empty is about to run).
	sweep *time.Timer
	armed bool
	// epoch counts the calls of CloseIdleConnections (written under mu): a connection dialed
	// in an earlier one is closed, not kept, when it comes back.
	epoch atomic.Uint64
}

func (c *Client) clock() time.Time {
	if c.now != nil {
		return c.now()
	}
	return time.Now()
}

// conn is one connection and its buffers.
type conn struct {
	c     net.Conn
	addr  string
	br    *bufio.Reader
	bw    *bufio.Writer
	w     countWriter   // under bw: bytes that reached the connection
	idle  time.Time     // when it was last returned
	el    *list.Element // in Client.lru while idle
	stop  func() bool   // the request's context.AfterFunc
	reuse bool          // it carried a request before this one
	epoch uint64        // Client.epoch when it was dialed
}

// countWriter counts the bytes written to the connection of a request.
type countWriter struct {
	c net.Conn
	n int64
}

func (w *countWriter) Write(p []byte) (int, error) {
	n, err := w.c.Write(p)
	w.n += int64(n)
	return n, err
}

// Do sends req and returns its answer, whose Body the caller must read and close (the
// connection is kept only when the body was read to EOF). It returns an error, a *url.Error,
// when no answer came: the connection failed, the answer was malformed, or req's context
// ended. Any answer, 3xx included, is returned as it is.
func (c *Client) Do(req *http.Request) (*http.Response, error) {
	if req.URL == nil || req.URL.Scheme != "http" || req.URL.Host == "" {
		return nil, urlError(req, ErrScheme)
	}
	ctx := req.Context()
	addr := hostPort(req.URL)
	for fresh := false; ; fresh = true {
		cn, err := c.take(ctx, addr, fresh)
		if err != nil {
			return nil, urlError(req, ctxErr(ctx, err))
		}
		resp, answered, err := cn.roundTrip(ctx, req)
		if err == nil {
			resp.Body = &body{rc: resp.Body, c: c, cn: cn, keep: keepAlive(req, resp)}
			return resp, nil
		}
		cn.stop()
		cn.c.Close()
		if !fresh && cn.reuse && !answered && ctx.Err() == nil {
			if again, ok := replay(req, cn.w.n == 0); ok {
				req = again
				continue
			}
		}
		return nil, urlError(req, ctxErr(ctx, err))
	}
}

// aLongTimeAgo is a deadline that has passed: it ends the connection's blocked reads and
// writes at once.
var aLongTimeAgo = time.Unix(1, 0)

// roundTrip writes req on cn and reads its answer's header. answered is whether any byte of
// the answer arrived.
func (cn *conn) roundTrip(ctx context.Context, req *http.Request) (_ *http.Response, answered bool, _ error) {
	// The context's end, not its deadline, sets the connection's: a deadline of its own could
	// pass a moment before the context reports its error, and a body cut short then would look
	// like one that ended.
	nc := cn.c
	cn.stop = context.AfterFunc(ctx, func() { nc.SetDeadline(aLongTimeAgo) })
	cn.w.n = 0
	if err := req.Write(cn.bw); err != nil {
		return nil, false, err
	}
	if err := cn.bw.Flush(); err != nil {
		return nil, false, err
	}
	if _, err := cn.br.Peek(1); err != nil {
		return nil, false, err
	}
	for n := 0; ; n++ {
		resp, err := http.ReadResponse(cn.br, req)
		if err != nil {
			return nil, true, err
		}
		if resp.StatusCode < 100 || resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, true, nil
		}
		if n == max1xx {
			return nil, true, errors.New("h1: too many 1xx informational responses")
		}
	}
}

// keepAlive reports whether the connection may carry another request after resp.
func keepAlive(req *http.Request, resp *http.Response) bool {
	if resp.Close || req.Close || resp.StatusCode == http.StatusSwitchingProtocols {
		return false
	}
	for _, v := range req.Header["Connection"] {
		for _, tok := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "close") {
				return false
			}
		}
	}
	return true
}

// replay returns the request to send again after its connection failed, and whether it may
// be: net/http's rule (Request.isReplayable and rewindBody). unwritten: no byte of it reached
// the connection.
func replay(req *http.Request, unwritten bool) (*http.Request, bool) {
	if !unwritten && !idempotent(req) {
		return nil, false
	}
	if req.Body == nil || req.Body == http.NoBody {
		return req, true
	}
	if req.GetBody == nil {
		return nil, false
	}
	b, err := req.GetBody()
	if err != nil {
		return nil, false
	}
	again := req.WithContext(req.Context()) // a shallow copy
	again.Body = b
	return again, true
}

// idempotent is net/http's test of a request that may be sent twice.
func idempotent(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	if _, ok := req.Header["Idempotency-Key"]; ok {
		return true
	}
	_, ok := req.Header["X-Idempotency-Key"]
	return ok
}

// body is an answer's body: it returns the connection when closed after its EOF.
type body struct {
	rc   io.ReadCloser // http.ReadResponse's
	c    *Client
	cn   *conn
	keep bool // the answer allows keep-alive
	eof  bool
	done bool
}

// errBodyClosed is a read after Close, as net/http's.
var errBodyClosed = errors.New("http: read on closed response body")

func (b *body) Read(p []byte) (int, error) {
	if b.done {
		return 0, errBodyClosed
	}
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

// Close returns the connection to the idle set when the body was read to its end, the answer
// allows keep-alive and the request's context has not ended; it closes it otherwise.
func (b *body) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	if b.rc == http.NoBody {
		b.eof = true
	}
	if b.cn.stop() && b.eof && b.keep {
		b.c.put(b.cn)
		return nil
	}
	return b.cn.c.Close()
}

// hostPort is the address a request to u dials.
func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// ctxErr is err as the caller sees it: the context's error when the context has ended.
func ctxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	return err
}

// urlError wraps err as http.Client does: the method as Op ("Get", "Post"), the URL without
// its password.
func urlError(req *http.Request, err error) error {
	op := "Get"
	if m := req.Method; m != "" {
		op = m[:1] + strings.ToLower(m[1:])
	}
	u := ""
	if req.URL != nil {
		r := *req.URL
		if _, has := r.User.Password(); has {
			r.User = url.UserPassword(r.User.Username(), "***")
		}
		u = r.String()
	}
	return &url.Error{Op: op, URL: u, Err: err}
}
