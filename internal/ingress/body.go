package ingress

import (
	"errors"
	"io"
	"net"
	"net/http"
)

// bodyReader wraps a request body and keeps the first error reading it, so that a failure
// that surfaces elsewhere (the proxy's transport, io.ReadAll) is answered as the client's
// fault it is: 408 for a body that stopped arriving (read_timeout), 400 for a malformed one
// (bad chunked encoding), never 5xx or 502.
type bodyReader struct {
	rc  io.ReadCloser
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil && err != io.EOF && b.err == nil {
		b.err = err
	}
	return n, err
}

func (b *bodyReader) Close() error { return b.rc.Close() }

// wrapBody installs a bodyReader on r when it has a body, and returns it (nil: no body).
func wrapBody(r *http.Request) *bodyReader {
	if r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	b := &bodyReader{rc: r.Body}
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
	var ne net.Error
	if errors.As(b.err, &ne) && ne.Timeout() {
		return errBodyTimeout
	}
	return errBodyMalformed
}
