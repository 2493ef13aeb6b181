package retry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"time"
)

// Class is what a caller should do after an HTTP attempt. The zero value is not a valid
// class, so an uninitialised Outcome is never mistaken for success.
type Class int

const (
	// Success: a 2xx response. Done.
	Success Class = iota + 1
	// Retry: a transient failure — a 5xx other than 503 (and other than 501 and 505, which no
	// retry can fix), 408 Request Timeout, 425 Too Early, a timeout, a refused or reset
	// connection. Try again after a backoff delay, spending an attempt.
	Retry
	// Pause: the server is throttling — 429 Too Many Requests or 503 Service Unavailable. Wait
	// (Outcome.Wait, when the server gave one) and try again; Sluice's workers pause the
	// whole queue and do not count the attempt.
	Pause
	// Permanent: trying again cannot help — other 4xx, 3xx (redirects are not followed
	// further), 1xx, unknown statuses, context.Canceled, TLS certificate and DNS "no such
	// host" errors. Give up (workers dead-letter the job).
	Permanent
)

func (c Class) String() string {
	switch c {
	case Success:
		return "success"
	case Retry:
		return "retry"
	case Pause:
		return "pause"
	case Permanent:
		return "permanent"
	}
	return "invalid"
}

// Outcome is the classification of one attempt.
type Outcome struct {
	Class Class
	// Wait is the server-requested wait, meaningful only when HasWait. For Pause it comes
	// from [FromHeaders]; for Retry only from an explicit Retry-After.
	Wait    time.Duration
	HasWait bool
	// Status is the response's status code, 0 when the attempt failed with an error.
	Status int
}

// Classify maps the result of one HTTP attempt — what http.Client.Do returned — to an
// Outcome, reading waits relative to now. When err is non-nil resp is ignored.
//
// Errors are transient unless known to be permanent: context.Canceled is Permanent (the
// caller gave up, so stop), while context.DeadlineExceeded is Retry because a per-attempt
// timeout (http.Client.Timeout, a worker's delivery timeout) looks exactly like it; a caller
// whose own deadline passed must check its context before retrying, as Sleep does.
// TLS certificate failures and DNS "no such host" are Permanent; everything else — net.Error
// timeouts, refused, reset or aborted connections, EOF mid-response — is Retry.
//
// A nil resp with a nil err is Permanent.
func Classify(resp *http.Response, err error, now time.Time) Outcome {
	if err != nil {
		return Outcome{Class: classifyError(err)}
	}
	if resp == nil {
		return Outcome{Class: Permanent}
	}
	out := Outcome{Status: resp.StatusCode}
	switch code := resp.StatusCode; {
	case code >= 200 && code <= 299:
		out.Class = Success
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		out.Class = Pause
		out.Wait, out.HasWait = FromHeaders(resp.Header, now)
	case code == http.StatusRequestTimeout || code == http.StatusTooEarly ||
		code >= 500 && code <= 599 && code != http.StatusNotImplemented && code != http.StatusHTTPVersionNotSupported:
		out.Class = Retry
		out.Wait, out.HasWait = ParseRetryAfter(resp.Header.Get("Retry-After"), now)
	default:
		out.Class = Permanent
	}
	return out
}

func classifyError(err error) Class {
	if errors.Is(err, context.Canceled) {
		return Permanent
	}
	var (
		certErr     *tls.CertificateVerificationError
		unknownAuth x509.UnknownAuthorityError
		hostErr     x509.HostnameError
		invalidErr  x509.CertificateInvalidError
		dnsErr      *net.DNSError
	)
	switch {
	case errors.As(err, &certErr), errors.As(err, &unknownAuth),
		errors.As(err, &hostErr), errors.As(err, &invalidErr):
		return Permanent
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		return Permanent
	}
	return Retry
}
