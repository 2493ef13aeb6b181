package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/retry"
	"github.com/sluice-rl/sluice/retry/retrytest"
)

func get(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Each form in which the server can say how long to wait, on the first answer; the second
// answer is 200. The fake clock records the wait the client chose.
func TestDoWaitsAsTheServerSays(t *testing.T) {
	httpDate := func(d time.Duration) string { return t0.Add(d).Format(http.TimeFormat) }
	tests := []struct {
		name   string
		status int
		kv     []string
		want   time.Duration
	}{
		{"Retry-After seconds", 429, []string{"Retry-After", "3"}, 3 * time.Second},
		{"Retry-After HTTP-date", 429, []string{"Retry-After", httpDate(7 * time.Second)}, 7 * time.Second},
		{"503 with Retry-After", 503, []string{"Retry-After", "2"}, 2 * time.Second},
		{"RateLimit reset of the exhausted policy", 429, []string{"RateLimit", `"burst";r=4;t=30, "orders-per-key";r=0;t=5`}, 5 * time.Second},
		{"X-RateLimit-Reset delta", 429, []string{"X-RateLimit-Reset", "6"}, 6 * time.Second},
		{"X-RateLimit-Reset epoch", 429, []string{"X-RateLimit-Reset", strconv.FormatInt(t0.Add(9*time.Second).Unix(), 10)}, 9 * time.Second},
		{"Retry-After takes precedence", 429, []string{"Retry-After", "2", "RateLimit", `"a";r=0;t=5`, "X-RateLimit-Reset", "6"}, 2 * time.Second},
		{"RateLimit before X-RateLimit-Reset", 429, []string{"RateLimit", `"a";r=0;t=5`, "X-RateLimit-Reset", "6"}, 5 * time.Second},
		// Malformed fields are ignored: the next source, or the backoff (Initial = 1s), decides.
		{"no headers: backoff", 429, nil, time.Second},
		{"garbage Retry-After: backoff", 429, []string{"Retry-After", "soon"}, time.Second},
		{"negative Retry-After falls through", 429, []string{"Retry-After", "-4", "X-RateLimit-Reset", "6"}, 6 * time.Second},
		{"broken RateLimit falls through", 429, []string{"RateLimit", `"a";r=0;t=`, "X-RateLimit-Reset", "6"}, 6 * time.Second},
		{"past HTTP-date: backoff instead of a zero wait", 429, []string{"Retry-After", httpDate(-time.Minute)}, time.Second},
		{"absurd Retry-After capped at MaxRetryAfter", 429, []string{"Retry-After", "99999999999"}, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newScripted(t, reply(tt.status, "slow down", tt.kv...), reply(200, "ok"))
			c, clock := newClient(t, srv.Server, client.WithPolicy(retry.Policy{
				Initial: time.Second, Jitter: -1, MaxAttempts: 3, MaxElapsed: 2 * time.Hour,
			}))
			resp, err := c.Do(context.Background(), get(t, srv.URL+"/api/orders"))
			if tt.want < 0 { // MaxRetryAfter (1h) fits in MaxElapsed (2h), so it is waited for
				tt.want = retry.MaxRetryAfter
			}
			if err != nil {
				t.Fatalf("Do: %v", err)
			}
			if body := readAll(t, resp); resp.StatusCode != 200 || body != "ok" {
				t.Fatalf("got %d %q, want the 200 of the second attempt", resp.StatusCode, body)
			}
			if got := clock.Waits(); !slices.Equal(got, []time.Duration{tt.want}) {
				t.Errorf("waits = %v, want [%v]", got, tt.want)
			}
			if n := len(srv.requests()); n != 2 {
				t.Errorf("server saw %d requests, want 2", n)
			}
		})
	}
}

func TestDoBudgetExhaustedReturnsRateLimitedError(t *testing.T) {
	problem := `{"type":"https://sluice.dev/problems#quota-exceeded","title":"Too Many Requests",` +
		`"detail":"orders-per-key: 10 per 1s","violated-policies":["orders-per-key","global"],"retry_after":2}`
	srv := newScripted(t, reply(429, problem, "Content-Type", "application/problem+json", "Retry-After", "2"))
	c, clock := newClient(t, srv.Server, client.WithPolicy(retry.Policy{Initial: time.Second, Jitter: -1, MaxAttempts: 3}))

	resp, err := c.Do(context.Background(), get(t, srv.URL+"/api/orders"))
	if resp != nil {
		t.Fatalf("got a response (%d) with the error", resp.StatusCode)
	}
	var rl *client.RateLimitedError
	if !errors.As(err, &rl) {
		t.Fatalf("err = %v, want *RateLimitedError", err)
	}
	want := client.RateLimitedError{RetryAfter: 2 * time.Second, Policies: []string{"orders-per-key", "global"}, Status: 429, Detail: "orders-per-key: 10 per 1s"}
	if rl.RetryAfter != want.RetryAfter || !slices.Equal(rl.Policies, want.Policies) || rl.Status != want.Status || rl.Detail != want.Detail {
		t.Errorf("error = %+v, want %+v", *rl, want)
	}
	if !errors.Is(err, client.ErrRateLimited) {
		t.Error("errors.Is(err, ErrRateLimited) is false")
	}
	if !strings.Contains(err.Error(), "orders-per-key, global") {
		t.Errorf("message %q does not name the policies", err)
	}
	if n := len(srv.requests()); n != 3 {
		t.Errorf("server saw %d requests, want MaxAttempts = 3", n)
	}
	if got := clock.Waits(); !slices.Equal(got, []time.Duration{2 * time.Second, 2 * time.Second}) {
		t.Errorf("waits = %v, want two of 2s", got)
	}
}

func TestDoWaitBeyondBudgetGivesUpAtOnce(t *testing.T) {
	t.Run("MaxElapsed", func(t *testing.T) {
		srv := newScripted(t, reply(429, "", "Retry-After", "30"), reply(200, "ok"))
		c, clock := newClient(t, srv.Server, client.WithPolicy(retry.Policy{MaxElapsed: 10 * time.Second}))
		_, err := c.Do(context.Background(), get(t, srv.URL))
		var rl *client.RateLimitedError
		if !errors.As(err, &rl) || rl.RetryAfter != 30*time.Second {
			t.Fatalf("err = %v, want *RateLimitedError with RetryAfter 30s", err)
		}
		if n, w := len(srv.requests()), clock.Waits(); n != 1 || len(w) != 0 {
			t.Errorf("server saw %d requests and the client waited %v; want 1 request, no wait", n, w)
		}
	})
	t.Run("MaxElapsed spent by earlier waits", func(t *testing.T) {
		srv := newScripted(t, reply(429, "", "Retry-After", "4"))
		c, clock := newClient(t, srv.Server, client.WithPolicy(retry.Policy{MaxElapsed: 10 * time.Second}))
		_, err := c.Do(context.Background(), get(t, srv.URL))
		if !errors.Is(err, client.ErrRateLimited) {
			t.Fatalf("err = %v, want ErrRateLimited", err)
		}
		// 4s + 4s fit in 10s, a third 4s would not.
		if n, w := len(srv.requests()), clock.Waits(); n != 3 || len(w) != 2 {
			t.Errorf("server saw %d requests and the client waited %v; want 3 requests, 2 waits", n, w)
		}
	})
	t.Run("context deadline", func(t *testing.T) {
		srv := newScripted(t, reply(429, "", "Retry-After", "3600"), reply(200, "ok"))
		c, clock := newClient(t, srv.Server, client.WithPolicy(retry.Policy{}))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := c.Do(ctx, get(t, srv.URL))
		if !errors.Is(err, client.ErrRateLimited) {
			t.Fatalf("err = %v, want ErrRateLimited rather than sleeping past the deadline", err)
		}
		if n, w := len(srv.requests()), clock.Waits(); n != 1 || len(w) != 0 {
			t.Errorf("server saw %d requests and the client waited %v; want 1 request, no wait", n, w)
		}
	})
}

func TestDoExhausted503ReturnsTheResponse(t *testing.T) {
	srv := newScripted(t, reply(503, "store down", "Retry-After", "1"))
	c, _ := newClient(t, srv.Server, client.WithPolicy(retry.Policy{Jitter: -1, MaxAttempts: 2}))
	resp, err := c.Do(context.Background(), get(t, srv.URL))
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	if body := readAll(t, resp); resp.StatusCode != 503 || body != "store down" {
		t.Errorf("got %d %q, want the last 503 with its body", resp.StatusCode, body)
	}
	if n := len(srv.requests()); n != 2 {
		t.Errorf("server saw %d requests, want 2", n)
	}
}

func TestDoNonIdempotentWithoutKeyIsNotRetried(t *testing.T) {
	for _, method := range []string{http.MethodPost, http.MethodPatch, "PURGE"} {
		t.Run(method+" 429", func(t *testing.T) {
			srv := newScripted(t, reply(429, "", "Retry-After", "1"), reply(200, "ok"))
			c, clock := newClient(t, srv.Server)
			req, _ := http.NewRequest(method, srv.URL+"/api/orders", strings.NewReader(`{"n":1}`))
			_, err := c.Do(context.Background(), req)
			var rl *client.RateLimitedError
			if !errors.As(err, &rl) || rl.RetryAfter != time.Second {
				t.Fatalf("err = %v, want *RateLimitedError with RetryAfter 1s", err)
			}
			if n, w := len(srv.requests()), clock.Waits(); n != 1 || len(w) != 0 {
				t.Errorf("server saw %d requests, client waited %v; want exactly 1 request", n, w)
			}
		})
	}
	t.Run("POST 503", func(t *testing.T) {
		srv := newScripted(t, reply(503, "busy"), reply(200, "ok"))
		c, _ := newClient(t, srv.Server)
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
		resp, err := c.Do(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if readAll(t, resp); resp.StatusCode != 503 || len(srv.requests()) != 1 {
			t.Errorf("got %d after %d requests, want the 503 after 1", resp.StatusCode, len(srv.requests()))
		}
	})
	t.Run("POST transport error", func(t *testing.T) {
		srv := newScripted(t, hangUp, reply(200, "ok"))
		c, _ := newClient(t, srv.Server)
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
		if _, err := c.Do(context.Background(), req); err == nil {
			t.Fatal("Do succeeded; want the transport error of the only attempt")
		}
		if n := len(srv.requests()); n != 1 {
			t.Errorf("server saw %d requests, want 1", n)
		}
	})
}

func TestDoPostWithKeyIsRetriedWithTheSameKeyAndBody(t *testing.T) {
	bodies := map[string]func() io.Reader{
		// strings.Reader gets a GetBody from http.NewRequest; a plain reader must be buffered.
		"GetBody":  func() io.Reader { return strings.NewReader(`{"order":42}`) },
		"buffered": func() io.Reader { return io.MultiReader(strings.NewReader(`{"order"`), strings.NewReader(`:42}`)) },
	}
	for name, body := range bodies {
		t.Run(name, func(t *testing.T) {
			srv := newScripted(t, reply(429, "", "Retry-After", "1"), reply(503, ""), reply(201, "created"))
			c, clock := newClient(t, srv.Server)
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/orders", body())
			req.Header.Set("Idempotency-Key", "order-42")
			resp, err := c.Do(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if readAll(t, resp); resp.StatusCode != 201 {
				t.Fatalf("status %d, want 201", resp.StatusCode)
			}
			reqs := srv.requests()
			if len(reqs) != 3 {
				t.Fatalf("server saw %d requests, want 3", len(reqs))
			}
			for i, r := range reqs {
				if k := r.Header.Get("Idempotency-Key"); k != "order-42" || r.Body != `{"order":42}` {
					t.Errorf("request %d: key %q body %q; want the same key and body every time", i+1, k, r.Body)
				}
			}
			// 1s from Retry-After, then the backoff for attempt 2 (Initial 1s * 2).
			if got := clock.Waits(); !slices.Equal(got, []time.Duration{time.Second, 2 * time.Second}) {
				t.Errorf("waits = %v", got)
			}
		})
	}
}

// hangUp closes the connection without answering: the client sees a transport error.
func hangUp(w http.ResponseWriter, r *http.Request) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		conn.Close()
	}
}

func TestDoRetriesTransportErrors(t *testing.T) {
	srv := newScripted(t, hangUp, hangUp, reply(200, "ok"))
	c, clock := newClient(t, srv.Server)
	resp, err := c.Do(context.Background(), get(t, srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); body != "ok" {
		t.Errorf("body %q", body)
	}
	if got := clock.Waits(); !slices.Equal(got, []time.Duration{time.Second, 2 * time.Second}) {
		t.Errorf("waits = %v, want the backoff 1s, 2s", got)
	}

	down := newScripted(t, hangUp)
	c, _ = newClient(t, down.Server, client.WithPolicy(retry.Policy{Jitter: -1, MaxAttempts: 2}))
	if _, err := c.Do(context.Background(), get(t, down.URL)); err == nil || errors.Is(err, client.ErrRateLimited) {
		t.Errorf("err = %v, want the transport error after the budget", err)
	}
	if n := len(down.requests()); n != 2 {
		t.Errorf("server saw %d requests, want 2", n)
	}
}

func TestDoReturnsOtherStatusesAtOnce(t *testing.T) {
	for _, status := range []int{200, 201, 301, 400, 404, 500, 502} {
		srv := newScripted(t, reply(status, "answer", "Retry-After", "1"), reply(299, ""))
		c, _ := newClient(t, srv.Server)
		resp, err := c.Do(context.Background(), get(t, srv.URL))
		if err != nil {
			t.Fatal(err)
		}
		if body := readAll(t, resp); resp.StatusCode != status || body != "answer" || len(srv.requests()) != 1 {
			t.Errorf("status %d: got %d %q after %d requests", status, resp.StatusCode, body, len(srv.requests()))
		}
	}
}

func TestDoCancelledMidWaitReturnsPromptly(t *testing.T) {
	srv := newScripted(t, reply(429, "", "Retry-After", "600"))
	clock := retrytest.NewClock(t0) // waits block until Advance, which never comes
	c, err := client.New(srv.URL, client.WithHTTPClient(srv.Client()), client.WithClock(clock), client.WithPolicy(retry.Policy{}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Do(ctx, get(t, srv.URL))
		done <- err
	}()

	bound, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	if err := clock.BlockUntilWaiters(bound, 1); err != nil {
		t.Fatalf("the client never started waiting: %v", err)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
	case <-bound.Done():
		t.Fatal("Do did not return after its context was cancelled")
	}
	if got := clock.Waits(); !slices.Equal(got, []time.Duration{600 * time.Second}) {
		t.Errorf("waits = %v, want the server's 600s", got)
	}
}

func TestDoResolvesRelativeURLsAndAddsHeaders(t *testing.T) {
	srv := newScripted(t, reply(200, ""))
	c, err := client.New(srv.URL+"/gw/",
		client.WithHTTPClient(srv.Client()),
		client.WithHeader("X-API-Key", "k1"),
		client.WithHeader("X-Tenant", "acme"),
		client.WithUserAgent("orders-service/2"),
	)
	if err != nil {
		t.Fatal(err)
	}
	req := get(t, "/api/orders?page=2")
	req.Header.Set("X-Tenant", "override")
	resp, err := c.Do(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	r := srv.requests()[0]
	if r.Path != "/gw/api/orders" || r.RawQuery != "page=2" {
		t.Errorf("server saw %s?%s, want /gw/api/orders?page=2", r.Path, r.RawQuery)
	}
	for k, want := range map[string]string{"X-Api-Key": "k1", "X-Tenant": "override", "User-Agent": "orders-service/2"} {
		if got := r.Header.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if req.URL.Host != "" || req.Header.Get("X-Api-Key") != "" {
		t.Error("Do modified the caller's request")
	}
}

func TestNewRejectsBadInput(t *testing.T) {
	for _, base := range []string{"", "localhost:8080", "ftp://host", "http://", "http://host/?q=1", "http://u:p@host", "http://host/#f", "::"} {
		if _, err := client.New(base); err == nil {
			t.Errorf("New(%q) succeeded", base)
		}
	}
	_, err := client.New("http://host",
		client.WithHTTPClient(nil), client.WithClock(nil), client.WithHeader("Bad Name", "v"), client.WithHeader("X", "a\r\nb"))
	if err == nil {
		t.Fatal("New with four bad options succeeded")
	}
	for _, part := range []string{"WithHTTPClient", "WithClock", `"Bad Name"`, "control character"} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("error %q does not report %s", err, part)
		}
	}
}
