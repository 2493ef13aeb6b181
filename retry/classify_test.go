package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/retry"
)

func response(status int, kv ...string) *http.Response {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return &http.Response{StatusCode: status, Header: h}
}

func TestClassifyResponses(t *testing.T) {
	tests := []struct {
		resp *http.Response
		want retry.Outcome
	}{
		{response(200), retry.Outcome{Class: retry.Success, Status: 200}},
		{response(202), retry.Outcome{Class: retry.Success, Status: 202}},
		{response(204), retry.Outcome{Class: retry.Success, Status: 204}},
		{response(429), retry.Outcome{Class: retry.Pause, Status: 429}},
		{response(429, "Retry-After", "7"), retry.Outcome{Class: retry.Pause, Status: 429, Wait: 7 * time.Second, HasWait: true}},
		{response(429, "RateLimit", `"k";r=0;t=2`), retry.Outcome{Class: retry.Pause, Status: 429, Wait: 2 * time.Second, HasWait: true}},
		{response(429, "Retry-After", "soon"), retry.Outcome{Class: retry.Pause, Status: 429}},
		{response(503, "X-RateLimit-Reset", "4"), retry.Outcome{Class: retry.Pause, Status: 503, Wait: 4 * time.Second, HasWait: true}},
		{response(500), retry.Outcome{Class: retry.Retry, Status: 500}},
		{response(502), retry.Outcome{Class: retry.Retry, Status: 502}},
		{response(504), retry.Outcome{Class: retry.Retry, Status: 504}},
		{response(599), retry.Outcome{Class: retry.Retry, Status: 599}},
		{response(408), retry.Outcome{Class: retry.Retry, Status: 408}},
		{response(425), retry.Outcome{Class: retry.Retry, Status: 425}},
		{response(500, "Retry-After", "5"), retry.Outcome{Class: retry.Retry, Status: 500, Wait: 5 * time.Second, HasWait: true}},
		// Only an explicit Retry-After is a wait for a transient failure, not a quota reset.
		{response(502, "RateLimit", `"k";r=0;t=2`), retry.Outcome{Class: retry.Retry, Status: 502}},
		{response(501), retry.Outcome{Class: retry.Permanent, Status: 501}},
		{response(505), retry.Outcome{Class: retry.Permanent, Status: 505}},
		{response(400), retry.Outcome{Class: retry.Permanent, Status: 400}},
		{response(401), retry.Outcome{Class: retry.Permanent, Status: 401}},
		{response(404), retry.Outcome{Class: retry.Permanent, Status: 404}},
		{response(409), retry.Outcome{Class: retry.Permanent, Status: 409}},
		{response(422, "Retry-After", "5"), retry.Outcome{Class: retry.Permanent, Status: 422}},
		{response(301), retry.Outcome{Class: retry.Permanent, Status: 301}},
		{response(304), retry.Outcome{Class: retry.Permanent, Status: 304}},
		{response(101), retry.Outcome{Class: retry.Permanent, Status: 101}},
		{response(600), retry.Outcome{Class: retry.Permanent, Status: 600}},
		{nil, retry.Outcome{Class: retry.Permanent}},
	}
	for _, tt := range tests {
		name := "nil response"
		if tt.resp != nil {
			name = fmt.Sprintf("%d %v", tt.resp.StatusCode, tt.resp.Header)
		}
		t.Run(name, func(t *testing.T) {
			if got := retry.Classify(tt.resp, nil, t0); got != tt.want {
				t.Errorf("Classify = %+v, want %+v", got, tt.want)
			}
		})
	}
}

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

func urlError(err error) error { return &url.Error{Op: "Post", URL: "http://upstream/x", Err: err} }

func TestClassifyErrors(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want retry.Class
	}{
		{"context canceled", urlError(context.Canceled), retry.Permanent},
		{"context deadline (a per-attempt timeout)", urlError(context.DeadlineExceeded), retry.Retry},
		{"net.Error timeout", urlError(&net.OpError{Op: "read", Net: "tcp", Err: timeoutError{}}), retry.Retry},
		{"connection refused", urlError(&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}), retry.Retry},
		{"connection reset", urlError(&net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}), retry.Retry},
		{"unexpected EOF", urlError(io.ErrUnexpectedEOF), retry.Retry},
		{"EOF", urlError(io.EOF), retry.Retry},
		{"temporary DNS failure", urlError(&net.DNSError{Err: "server misbehaving", Name: "x", IsTemporary: true}), retry.Retry},
		{"no such host", urlError(&net.DNSError{Err: "no such host", Name: "x", IsNotFound: true}), retry.Permanent},
		{"unknown error", errors.New("something odd"), retry.Retry},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A response passed along with an error is ignored.
			got := retry.Classify(response(200), tt.err, t0)
			if got != (retry.Outcome{Class: tt.want}) {
				t.Errorf("Classify(%v) = %+v, want class %v and nothing else", tt.err, got, tt.want)
			}
		})
	}
}

// The errors of real round trips, not hand-built ones.
func TestClassifyRealTransportErrors(t *testing.T) {
	t.Run("connection refused", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		_, err = http.Get("http://" + addr + "/")
		if err == nil {
			t.Skip("something else is listening on the freed port")
		}
		if got := retry.Classify(nil, err, t0).Class; got != retry.Retry {
			t.Errorf("Classify(%v) = %v, want retry", err, got)
		}
	})
	t.Run("untrusted certificate", func(t *testing.T) {
		srv := httptest.NewTLSServer(http.NotFoundHandler())
		t.Cleanup(srv.Close)
		client := &http.Client{Transport: &http.Transport{}}
		t.Cleanup(client.CloseIdleConnections)
		_, err := client.Get(srv.URL)
		if got := retry.Classify(nil, err, t0).Class; got != retry.Permanent {
			t.Errorf("Classify(%v) = %v, want permanent", err, got)
		}
	})
	t.Run("cancelled request", func(t *testing.T) {
		srv := httptest.NewServer(http.NotFoundHandler())
		t.Cleanup(srv.Close)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		_, err := srv.Client().Do(req)
		if got := retry.Classify(nil, err, t0).Class; got != retry.Permanent {
			t.Errorf("Classify(%v) = %v, want permanent", err, got)
		}
	})
}

func TestClassString(t *testing.T) {
	for c, want := range map[retry.Class]string{
		retry.Success: "success", retry.Retry: "retry", retry.Pause: "pause", retry.Permanent: "permanent", 0: "invalid",
	} {
		if got := c.String(); got != want {
			t.Errorf("Class(%d).String() = %q, want %q", int(c), got, want)
		}
	}
}
