package ingress

import (
	"errors"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
)

// bodyReader wraps a request body and keeps the first error reading it, so that a failure
// that surfaces elsewhere (the proxy's transport, io.ReadAll) is answered as the client's
// fault it is: 408 for a body that stopped arriving (read_timeout), 400 for a malformed one
// (bad chunked encoding), never 5xx or 502.
type bodyReader struct {
	rc  io.ReadCloser
	err error

	// limit, when > 0, is the max_body_bytes of queue, the smallest of the queues a forwarded
	// request may be deferred to: beyond it the body is cut off, and answered 413, as it
	// would be were the request deferred (limitBody).
	limit int64
	queue string
	n     int64 // bytes read so far

	// head is what peek read ahead and Read has not passed on yet.
	head []byte

	// w is the request's response, whose connection's read deadline peek shortens; until is
	// the read_timeout deadline it puts back (about the server's own, set as the headers were
	// read).
	w     http.ResponseWriter
	until time.Time
	// held is what peek took of ahead (the bytes it allocated), given back by release.
	ahead *readAhead
	held  int64
}

// readAheadTimeout is how long the ingress waits for the part of a body it reads ahead to find
// a cost in it, however long read_timeout is: a body that has not arrived by then is cut off
// (408), so that the read-ahead bound is not held by slow clients.
var readAheadTimeout = 5 * time.Second

// readAhead bounds the bytes held by cost read-ahead across all requests (read_ahead_bytes).
// It is safe for concurrent use.
type readAhead struct {
	held  atomic.Int64
	bound atomic.Int64
}

// take takes n bytes of the bound, and reports whether they were free.
func (a *readAhead) take(n int64) bool {
	for {
		h := a.held.Load()
		if h+n > a.bound.Load() {
			return false
		}
		if a.held.CompareAndSwap(h, h+n) {
			return true
		}
	}
}

// release gives back what peek took of the read-ahead bound. It is safe to call on a nil b and
// more than once; the server calls it once the request is answered. It leaves head alone: the
// transport may still be reading the forwarded body then (a forwarded request is full duplex,
// and a stream cut short ends the handler while the transport's writer runs), so head goes
// with the bodyReader once neither holds it.
func (b *bodyReader) release() {
	if b == nil || b.held == 0 {
		return
	}
	b.ahead.held.Add(-b.held)
	b.held = 0
}

func (b *bodyReader) Read(p []byte) (int, error) {
	if b.limit > 0 && b.n > b.limit {
		return 0, b.err
	}
	var n int
	var err error
	if len(b.head) > 0 {
		n = copy(p, b.head)
		b.head = b.head[n:]
	} else {
		n, err = b.rc.Read(p)
	}
	b.n += int64(n)
	if b.limit > 0 && b.n > b.limit {
		err = &bodyTooLargeError{queue: b.queue, limit: b.limit}
		b.err = err
		return n - int(b.n-b.limit), err
	}
	if err != nil && err != io.EOF && b.err == nil {
		b.err = err
	}
	return n, err
}

func (b *bodyReader) Close() error { return b.rc.Close() }

// peek reads up to max bytes of the body ahead, for a cost read from it, and keeps them for
// Read to pass on. whole reports that they are the whole body. The buffer is max + 1 bytes
// (Content-Length + 1 when that is less), taken from a first: when a has not that many free,
// peek reads nothing and reports skipped. The connection's read deadline is readAheadTimeout
// meanwhile. An error reading is kept, as Read keeps it, for problem to answer.
func (b *bodyReader) peek(a *readAhead, max, contentLength int64) (head []byte, whole, skipped bool, err error) {
	size := max + 1
	if contentLength >= 0 && contentLength < max {
		size = contentLength + 1
	}
	if !a.take(size) {
		return nil, false, true, nil
	}
	b.ahead, b.held = a, size
	rc := http.NewResponseController(b.w)
	if b.w != nil && rc.SetReadDeadline(time.Now().Add(readAheadTimeout)) == nil {
		defer func() { _ = rc.SetReadDeadline(b.until) }()
	}
	buf := make([]byte, size)
	n := 0
	for n < len(buf) {
		k, err := b.rc.Read(buf[n:])
		n += k
		if err == io.EOF {
			b.head = buf[:n]
			return b.head, true, false, nil
		}
		if err != nil {
			b.head = buf[:n]
			if b.err == nil {
				b.err = err
			}
			return nil, false, false, err
		}
	}
	b.head = buf
	return buf, false, false, nil
}

// wrapBody installs a bodyReader on r when it has a body, and returns it (nil: no body).
// readTimeout is the server's read_timeout, which peek puts back after its own deadline.
func wrapBody(w http.ResponseWriter, r *http.Request, readTimeout time.Duration) *bodyReader {
	if r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	b := &bodyReader{rc: r.Body, w: w, until: time.Now().Add(readTimeout)}
	r.Body = b
	return b
}

var (
	errBodyTimeout = &Problem{Type: "about:blank", Title: "Request timeout", Status: http.StatusRequestTimeout,
		Detail: "the request body did not arrive within the server's read timeout"}
	errBodyMalformed = badRequest("malformed request body", "the request body could not be read (for example, bad chunked encoding)")
)

// bodyProblem returns the problem of reading r's body while r.Body is still the bodyReader
// (the job API; the reverse proxy replaces it, and keeps its own reference: forwardWriter).
func bodyProblem(r *http.Request) *Problem {
	b, _ := r.Body.(*bodyReader)
	return b.problem()
}

// problem returns the problem of the body read, and nil when reading it did not fail (or
// failed for being too large, which the caller answers as 413). A nil b has none.
func (b *bodyReader) problem() *Problem {
	if b == nil || b.err == nil {
		return nil
	}
	var mbe *http.MaxBytesError
	if errors.As(b.err, &mbe) {
		return nil
	}
	var big *bodyTooLargeError
	if errors.As(b.err, &big) {
		return problemFor(big)
	}
	var ne net.Error
	if errors.As(b.err, &ne) && ne.Timeout() {
		return errBodyTimeout
	}
	return errBodyMalformed
}

// limitBody holds a forwarded request that a rule may defer to bound to the smallest
// max_body_bytes of those rules' queues, so that a body is refused with 413 whether the
// request is forwarded or deferred, not only once it would be queued. A Content-Length over
// the limit is refused at once; it returns the problem to answer (nil: go on).
func limitBody(r *http.Request, matched []*rule, queues map[string]*config.Queue) *Problem {
	b, _ := r.Body.(*bodyReader)
	var q *config.Queue
	for _, ru := range matched {
		if !ru.defers() || ru.shadow {
			continue
		}
		if rq := queues[ru.queue]; rq != nil && rq.MaxBodyBytes > 0 && (q == nil || rq.MaxBodyBytes < q.MaxBodyBytes) {
			q = rq
		}
	}
	switch {
	case q == nil:
		return nil
	case r.ContentLength > q.MaxBodyBytes:
		return problemFor(&bodyTooLargeError{queue: q.Name, limit: q.MaxBodyBytes})
	case b != nil:
		b.limit, b.queue = q.MaxBodyBytes, q.Name
	}
	return nil
}
