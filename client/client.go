// Package client is the Go SDK for Sluice, a queue-backed HTTP throttler.
//
// A [Client] talks to a Sluice ingress. It does three things:
//
//   - Submit deferred jobs and follow them: [Client.Submit] posts a job to a queue (always with
//     an Idempotency-Key, so retrying it can never create a second job), [Client.Job] reads
//     its state and [Client.Wait] polls until it has succeeded or failed.
//   - Send any request through the ingress with [Client.Do], which honours the ingress's 429
//     and 503 responses: it waits with exponential backoff and jitter, never less than the
//     server asks (Retry-After, then the RateLimit field's reset, then X-RateLimit-Reset), and
//     tries again within the client's retry budget, or returns a [*RateLimitedError].
//   - Expose what the last response said about the caller's quota: [Client.RateLimit].
//
// The package imports only the standard library and Sluice's retry package, so linking it
// into an application pulls in no server dependency. A Client is safe for concurrent use.
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/retry"
)

// defaultPolicy bounds the retries of Do and Submit: at most 5 attempts within a minute,
// waiting 0.5s, 1s, 2s, 4s (±50%) when the server does not say how long.
var defaultPolicy = retry.Policy{
	Initial:     500 * time.Millisecond,
	Max:         30 * time.Second,
	MaxAttempts: 5,
	MaxElapsed:  time.Minute,
}

// defaultPollPolicy paces Wait: 100ms growing by half each poll up to 5s, ±20%.
var defaultPollPolicy = retry.Policy{
	Initial:    100 * time.Millisecond,
	Max:        5 * time.Second,
	Multiplier: 1.5,
	Jitter:     0.2,
}

const defaultUserAgent = "sluice-go-client"

// maxErrorBody bounds how much of an error response is read to build an error.
const maxErrorBody = 64 << 10

// Client is a Sluice API client. Create one with [New]; it is safe for concurrent use and
// should be reused, like an http.Client.
type Client struct {
	base      *url.URL
	hc        *http.Client
	policy    retry.Policy
	poll      retry.Policy
	clock     retry.Clock
	header    http.Header
	userAgent string

	mu sync.Mutex
	rl RateLimitState
}

// Option configures a Client in [New]. An option may fail, and New reports it.
type Option func(*Client) error

// WithHTTPClient sets the http.Client used for every call (default: a new http.Client on
// http.DefaultTransport, without timeout — bound calls with their contexts).
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) error {
		if hc == nil {
			return errors.New("client: WithHTTPClient: nil *http.Client")
		}
		c.hc = hc
		return nil
	}
}

// WithPolicy sets the retry budget and backoff of Do and Submit. The default is at most 5
// attempts within one minute, with backoff from 500ms doubling to 30s, ±50%. Note that the
// zero fields of a retry.Policy mean unbounded attempts and elapsed time: with
// WithPolicy(retry.Policy{}) only the context limits the retries.
func WithPolicy(p retry.Policy) Option {
	return func(c *Client) error {
		c.policy = p
		return nil
	}
}

// WithPollPolicy sets the pace of Wait's polling (default: from 100ms, ×1.5 per poll up to
// 5s, ±20%). Its MaxAttempts and MaxElapsed are ignored: bound Wait with its context.
func WithPollPolicy(p retry.Policy) Option {
	return func(c *Client) error {
		c.poll = p
		return nil
	}
}

// WithClock sets the clock used for waiting between attempts and for measuring the retry
// budget (default: retry.SystemClock). Tests pass a fake clock so nothing really sleeps.
func WithClock(clock retry.Clock) Option {
	return func(c *Client) error {
		if clock == nil {
			return errors.New("client: WithClock: nil clock")
		}
		c.clock = clock
		return nil
	}
}

// WithHeader adds a header to every request that does not set it already, e.g.
// WithHeader("X-API-Key", key). It fails on a name that is not an HTTP token and on a value
// containing a line break.
func WithHeader(key, value string) Option {
	return func(c *Client) error {
		if !validHeaderName(key) {
			return fmt.Errorf("client: WithHeader: invalid header name %q", key)
		}
		if strings.ContainsAny(value, "\r\n\x00") {
			return fmt.Errorf("client: WithHeader %s: value contains a control character", key)
		}
		c.header.Add(key, value)
		return nil
	}
}

// WithUserAgent sets the User-Agent of requests that do not set one (default
// "sluice-go-client").
func WithUserAgent(ua string) Option {
	return func(c *Client) error {
		if strings.ContainsAny(ua, "\r\n\x00") {
			return errors.New("client: WithUserAgent: value contains a control character")
		}
		c.userAgent = ua
		return nil
	}
}

// New returns a client for the ingress at baseURL, an absolute http or https URL, possibly
// with a path prefix (https://gw.example.com/sluice). It returns an error for an invalid URL
// or a failing option.
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("client: base URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: base URL %q: want an absolute http or https URL", baseURL)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("client: base URL %q: must not carry a query, fragment or user info", baseURL)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = strings.TrimRight(u.RawPath, "/")
	c := &Client{
		base:      u,
		hc:        &http.Client{},
		policy:    defaultPolicy,
		poll:      defaultPollPolicy,
		clock:     retry.SystemClock,
		header:    http.Header{},
		userAgent: defaultUserAgent,
	}
	var errs []error
	for _, opt := range opts {
		if err := opt(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, nil
}

// endpoint returns the URL of an API path below the base URL, each segment escaped.
func (c *Client) endpoint(segments ...string) string {
	var b strings.Builder
	b.WriteString(c.base.String())
	for _, s := range segments {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(s))
	}
	return b.String()
}

// NewIdempotencyKey returns a fresh Idempotency-Key: 128 random bits from crypto/rand, in hex.
// Submit uses it when no key is given; callers of Do can use it to make a POST retryable.
func NewIdempotencyKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	return hex.EncodeToString(b[:])
}

// Do sends req through the ingress and retries it when the ingress throttles it. It is the
// http.Client.Do of Sluice: a non-2xx response is returned as a response, not an error —
// except a 429 that is not retried further, which becomes a [*RateLimitedError] (the response
// body is then read and closed).
//
// ctx governs the whole call, waits included; req's own context is replaced. A URL without a
// host is relative to the base URL (its path is appended to the base path), and the client's
// default headers and User-Agent are added where req does not set them. req is not modified.
//
// What is retried: 429 and 503 responses, and transport errors that retry.Classify deems
// transient (refused or reset connections, timeouts); other responses are returned at once.
// The wait before the next attempt is the policy's backoff delay (retry.Backoff), but never
// shorter than the server's own wait when it gives one — Retry-After, else the longest reset
// of an exhausted RateLimit policy, else X-RateLimit-Reset (see retry.FromHeaders).
//
// When: only idempotent methods (GET, HEAD, OPTIONS, TRACE, PUT, DELETE) and requests that
// carry an Idempotency-Key header, which makes a POST or PATCH safe to repeat. The body is
// replayed with req.GetBody; when that is nil, the body is buffered in memory once.
//
// How long: within the policy's MaxAttempts and MaxElapsed (see WithPolicy), and never
// starting a wait that would end after ctx's deadline or the MaxElapsed budget — such a call
// gives up at once instead: a 429 as *RateLimitedError, a 503 as the response itself, a
// transport error as that error. A cancelled ctx stops the wait at once and returns
// ctx.Err().
func (c *Client) Do(ctx context.Context, req *http.Request) (*http.Response, error) {
	req, retryable, err := c.prepare(ctx, req)
	if err != nil {
		return nil, err
	}
	start := c.clock.Now()
	b := c.policy.Backoff(c.clock)
	for attempt := 1; ; attempt++ {
		r := req
		if attempt > 1 {
			r = req.Clone(ctx)
			if req.GetBody != nil {
				if r.Body, err = req.GetBody(); err != nil {
					return nil, fmt.Errorf("client: replaying the request body: %w", err)
				}
			}
		}
		resp, err := c.hc.Do(r)
		now := c.clock.Now()
		if resp != nil {
			c.observe(resp.Header, now)
		}
		out := retry.Classify(resp, err, now)
		switch {
		case err != nil && (out.Class != retry.Retry || ctx.Err() != nil):
			return nil, err
		case err == nil && out.Class != retry.Pause:
			return resp, nil
		}

		var floor time.Duration
		if out.HasWait {
			floor = max(out.Wait, 0)
		}
		wait, more := b.Next(floor)
		if !retryable || !more || !c.withinBudget(ctx, attempt, now.Sub(start), wait) {
			if err != nil {
				return nil, err
			}
			if resp.StatusCode == http.StatusTooManyRequests {
				return nil, rateLimitedError(resp, out)
			}
			return resp, nil
		}
		if resp != nil {
			drain(resp.Body)
		}
		if err := retry.Sleep(ctx, c.clock, wait); err != nil {
			return nil, err
		}
	}
}

// withinBudget reports whether another attempt, after waiting wait, is allowed.
func (c *Client) withinBudget(ctx context.Context, attempt int, elapsed, wait time.Duration) bool {
	p := c.policy
	if p.MaxAttempts > 0 && attempt >= p.MaxAttempts {
		return false
	}
	if p.MaxElapsed > 0 && elapsed+wait > p.MaxElapsed {
		return false
	}
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
		return false // ctx deadlines are on the real clock, whatever clock waits run on
	}
	return true
}

// prepare returns the request to send: a copy of req bound to ctx, resolved against the
// base URL, with default headers, and with a replayable body when it may be retried.
func (c *Client) prepare(ctx context.Context, req *http.Request) (*http.Request, bool, error) {
	if req == nil || req.URL == nil {
		return nil, false, errors.New("client: Do: nil request or URL")
	}
	r := req.Clone(ctx)
	if r.URL.Host == "" && r.URL.Scheme == "" {
		u := *c.base
		u.Path = c.base.Path + "/" + strings.TrimLeft(r.URL.Path, "/")
		u.RawPath = ""
		if r.URL.RawPath != "" {
			u.RawPath = c.base.EscapedPath() + "/" + strings.TrimLeft(r.URL.RawPath, "/")
		}
		u.RawQuery = r.URL.RawQuery
		r.URL = &u
		r.Host = ""
	}
	for k, vs := range c.header {
		if _, set := r.Header[k]; !set {
			r.Header[k] = vs
		}
	}
	if r.Header.Get("User-Agent") == "" && c.userAgent != "" {
		r.Header.Set("User-Agent", c.userAgent)
	}

	retryable := idempotent(r.Method) || r.Header.Get("Idempotency-Key") != ""
	if r.Body == http.NoBody {
		r.Body = nil
	}
	if retryable && r.Body != nil && r.GetBody == nil {
		data, err := io.ReadAll(r.Body)
		r.Body.Close()
		if err != nil {
			return nil, false, fmt.Errorf("client: buffering the request body: %w", err)
		}
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
		r.Body, _ = r.GetBody()
		r.ContentLength = int64(len(data))
	}
	return r, retryable, nil
}

// idempotent reports the methods RFC 9110 section 9.2.2 defines as idempotent.
func idempotent(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace,
		http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// drain reads a little of a body so the connection can be reused, then closes it.
func drain(body io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(body, maxErrorBody))
	_ = body.Close()
}

func validHeaderName(s string) bool { return retry.IsToken(s) }
