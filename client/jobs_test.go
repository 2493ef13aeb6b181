package client_test

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/retry"
	"github.com/sluice-rl/sluice/retry/retrytest"
)

const accepted = `{"id":"j-1","queue":"orders","state":"queued","status_url":"/v1/jobs/j-1"}`

func TestSubmitGeneratesAKeyAndReusesItAcrossRetries(t *testing.T) {
	srv := newScripted(t,
		// First, on a fresh connection: net/http retries some requests on reused connections
		// by itself, which would hide the client's own retry.
		hangUp,
		reply(503, `{"title":"queue store unreachable"}`, "Retry-After", "1", "Content-Type", "application/problem+json"),
		reply(429, "", "Retry-After", "2"),
		reply(202, accepted, "Location", "/v1/jobs/j-1"),
	)
	c, clock := newClient(t, srv.Server)
	job, err := c.Submit(context.Background(), "orders", []byte(`{"sku":"A1"}`))
	if err != nil {
		t.Fatal(err)
	}
	want := client.Job{ID: "j-1", Queue: "orders", State: client.StateQueued, StatusURL: "/v1/jobs/j-1"}
	if *job != want {
		t.Errorf("job = %+v, want %+v", *job, want)
	}
	reqs := srv.requests()
	if len(reqs) != 4 {
		t.Fatalf("server saw %d requests, want 4", len(reqs))
	}
	key := reqs[0].Header.Get("Idempotency-Key")
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(key) {
		t.Errorf("generated key %q is not 128 bits of hex", key)
	}
	for i, r := range reqs {
		if r.Method != http.MethodPost || r.Path != "/v1/queues/orders/jobs" || r.Body != `{"sku":"A1"}` ||
			r.Header.Get("Content-Type") != "application/json" || r.Header.Get("Idempotency-Key") != key {
			t.Errorf("request %d = %s %s %q %v; want the same POST with key %s", i+1, r.Method, r.Path, r.Body, r.Header, key)
		}
	}
	// The backoff doubles from 1s across the retries; a server's wait is a floor, not a
	// replacement: 1s (backoff), 2s (backoff, above Retry-After 1), 4s (backoff, above 2).
	if got := clock.Waits(); !slices.Equal(got, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}) {
		t.Errorf("waits = %v, want 1s, 2s, 4s", got)
	}

	// Another call gets another key.
	if _, err := c.Submit(context.Background(), "orders", nil); err != nil {
		t.Fatal(err)
	}
	if k := srv.requests()[4].Header.Get("Idempotency-Key"); k == key || k == "" {
		t.Errorf("second Submit used key %q, want a fresh one", k)
	}
}

func TestSubmitOptionsAndReplay(t *testing.T) {
	srv := newScripted(t, reply(202, `{"id":"j-9","queue":"mail box","state":"running"}`,
		"Idempotent-Replayed", "true", "Location", "/v1/jobs/j-9"))
	c, _ := newClient(t, srv.Server)
	job, err := c.Submit(context.Background(), "mail box", []byte("hello"),
		client.WithIdempotencyKey("mail-7"), client.WithContentType("text/plain"))
	if err != nil {
		t.Fatal(err)
	}
	if !job.Replayed || job.ID != "j-9" || job.State != client.StateRunning {
		t.Errorf("job = %+v, want replayed j-9 running", *job)
	}
	if job.StatusURL != "/v1/jobs/j-9" {
		t.Errorf("StatusURL = %q, want the Location header when the body has none", job.StatusURL)
	}
	r := srv.requests()[0]
	if r.EscapedPath != "/v1/queues/mail%20box/jobs" || r.Header.Get("Idempotency-Key") != "mail-7" || r.Header.Get("Content-Type") != "text/plain" {
		t.Errorf("request = %s key %q type %q", r.EscapedPath, r.Header.Get("Idempotency-Key"), r.Header.Get("Content-Type"))
	}
}

func TestSubmitErrors(t *testing.T) {
	t.Run("unknown queue", func(t *testing.T) {
		srv := newScripted(t, reply(404, `{"type":"https://sluice.dev/problems#unknown-queue","title":"Not Found","detail":"no queue \"nope\""}`,
			"Content-Type", "application/problem+json"))
		c, _ := newClient(t, srv.Server)
		_, err := c.Submit(context.Background(), "nope", nil)
		var apiErr *client.APIError
		if !errors.As(err, &apiErr) {
			t.Fatalf("err = %v, want *APIError", err)
		}
		want := client.APIError{Status: 404, Type: "https://sluice.dev/problems#unknown-queue", Title: "Not Found", Detail: `no queue "nope"`}
		if *apiErr != want {
			t.Errorf("error = %+v, want %+v", *apiErr, want)
		}
	})
	t.Run("body that is not a problem", func(t *testing.T) {
		srv := newScripted(t, reply(413, "too big\n", "Content-Type", "text/plain"))
		c, _ := newClient(t, srv.Server)
		_, err := c.Submit(context.Background(), "orders", make([]byte, 10))
		var apiErr *client.APIError
		if !errors.As(err, &apiErr) || *apiErr != (client.APIError{Status: 413, Title: "Request Entity Too Large", Detail: "too big"}) {
			t.Fatalf("err = %#v", err)
		}
	})
	t.Run("queue full", func(t *testing.T) {
		srv := newScripted(t, reply(429, `{"title":"queue full","detail":"orders holds 100000 jobs"}`,
			"Content-Type", "application/problem+json", "Retry-After", "120"))
		c, _ := newClient(t, srv.Server, client.WithPolicy(retry.Policy{MaxElapsed: time.Minute}))
		_, err := c.Submit(context.Background(), "orders", nil)
		var rl *client.RateLimitedError
		if !errors.As(err, &rl) || rl.RetryAfter != 2*time.Minute || rl.Detail != "orders holds 100000 jobs" {
			t.Fatalf("err = %v, want *RateLimitedError after 120s", err)
		}
		if n := len(srv.requests()); n != 1 {
			t.Errorf("server saw %d requests; a 120s wait does not fit a 1m budget", n)
		}
	})
	t.Run("empty queue name", func(t *testing.T) {
		c, _ := newClient(t, newScripted(t, reply(202, accepted)).Server)
		if _, err := c.Submit(context.Background(), "", nil); err == nil {
			t.Error("Submit with an empty queue name succeeded")
		}
	})
	t.Run("undecodable answer", func(t *testing.T) {
		c, _ := newClient(t, newScripted(t, reply(202, "<html>")).Server)
		if _, err := c.Submit(context.Background(), "orders", nil); err == nil || !strings.Contains(err.Error(), "decoding") {
			t.Errorf("err = %v, want a decoding error", err)
		}
	})
}

func TestJob(t *testing.T) {
	srv := newScripted(t,
		reply(200, `{"id":"j/1","queue":"orders","state":"retrying","attempts":2,"created_at":"2025-03-14T15:09:26Z",`+
			`"updated_at":"2025-03-14T15:09:30.5Z","last_error":"upstream 502","response":{"status":502}}`),
		reply(200, `{"id":"j/2","queue":"orders","state":"queued","attempts":0,"eta":"2025-03-14T15:09:36.25Z"}`),
		reply(404, `{"title":"Not Found"}`, "Content-Type", "application/problem+json"),
	)
	c, _ := newClient(t, srv.Server)
	job, err := c.Job(context.Background(), "j/1")
	if err != nil {
		t.Fatal(err)
	}
	if job.ID != "j/1" || job.State != client.StateRetrying || job.Attempts != 2 || job.LastError != "upstream 502" ||
		job.Response == nil || job.Response.Status != 502 || !job.CreatedAt.Equal(t0) ||
		!job.UpdatedAt.Equal(t0.Add(4500*time.Millisecond)) {
		t.Errorf("job = %+v", *job)
	}
	if r := srv.requests()[0]; r.Method != http.MethodGet || r.EscapedPath != "/v1/jobs/j%2F1" {
		t.Errorf("request = %s %s, want the id escaped as one segment", r.Method, r.EscapedPath)
	}
	if job.ETA != nil {
		t.Errorf("a retrying job without eta: ETA %v, want nil", job.ETA)
	}
	queued, err := c.Job(context.Background(), "j/2")
	if err != nil {
		t.Fatal(err)
	}
	if queued.ETA == nil || !queued.ETA.Equal(t0.Add(10250*time.Millisecond)) {
		t.Errorf("a queued job's ETA = %v, want %v", queued.ETA, t0.Add(10250*time.Millisecond))
	}

	_, err = c.Job(context.Background(), "gone")
	if !errors.Is(err, client.ErrJobNotFound) {
		t.Errorf("err = %v, want ErrJobNotFound", err)
	}
}

func jobIn(state client.State, attempts int) http.HandlerFunc {
	return reply(200, `{"id":"j-1","queue":"orders","state":"`+string(state)+`","attempts":`+strconv.Itoa(attempts)+`,"last_error":"upstream 400"}`)
}

func TestWaitUntilSucceeded(t *testing.T) {
	srv := newScripted(t,
		jobIn(client.StateQueued, 0), jobIn(client.StateQueued, 0), jobIn(client.StateQueued, 0),
		jobIn(client.StateRunning, 1), jobIn(client.StateRetrying, 1), jobIn(client.StateRetrying, 1),
		jobIn(client.StateSucceeded, 2),
	)
	c, clock := newClient(t, srv.Server, client.WithPollPolicy(retry.Policy{Initial: 100 * time.Millisecond, Max: 300 * time.Millisecond, Jitter: -1}))
	job, err := c.Wait(context.Background(), "j-1")
	if err != nil {
		t.Fatal(err)
	}
	if job.State != client.StateSucceeded || job.Attempts != 2 {
		t.Errorf("job = %+v", *job)
	}
	// The backoff grows while the state stays, capped at 300ms, and restarts when it changes.
	ms := time.Millisecond
	want := []time.Duration{100 * ms, 200 * ms, 300 * ms, 100 * ms, 100 * ms, 200 * ms}
	if got := clock.Waits(); !slices.Equal(got, want) {
		t.Errorf("waits = %v, want %v", got, want)
	}
	if n := len(srv.requests()); n != 7 {
		t.Errorf("server saw %d polls, want 7", n)
	}
}

func TestWaitUntilFailed(t *testing.T) {
	srv := newScripted(t, jobIn(client.StateRunning, 1), jobIn(client.StateFailed, 3))
	c, _ := newClient(t, srv.Server)
	job, err := c.Wait(context.Background(), "j-1")
	var failed *client.JobFailedError
	if !errors.As(err, &failed) {
		t.Fatalf("err = %v, want *JobFailedError", err)
	}
	if failed.Job != job || job.State != client.StateFailed || job.Attempts != 3 {
		t.Errorf("job = %+v, error's job = %+v", job, failed.Job)
	}
	if !strings.Contains(err.Error(), "upstream 400") || !strings.Contains(err.Error(), "3 attempts") {
		t.Errorf("message %q should give the attempts and the last error", err)
	}
}

func TestWaitStops(t *testing.T) {
	t.Run("unknown job", func(t *testing.T) {
		srv := newScripted(t, jobIn(client.StateQueued, 0), reply(404, ""))
		c, _ := newClient(t, srv.Server)
		job, err := c.Wait(context.Background(), "j-1")
		if !errors.Is(err, client.ErrJobNotFound) || job == nil || job.State != client.StateQueued {
			t.Errorf("Wait = %+v, %v; want the last job seen and ErrJobNotFound", job, err)
		}
	})
	t.Run("cancelled mid-wait", func(t *testing.T) {
		srv := newScripted(t, jobIn(client.StateQueued, 0))
		clock := retrytest.NewClock(t0)
		c, err := client.New(srv.URL, client.WithHTTPClient(srv.Client()), client.WithClock(clock))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		type result struct {
			job *client.Job
			err error
		}
		done := make(chan result, 1)
		go func() {
			job, err := c.Wait(ctx, "j-1")
			done <- result{job, err}
		}()
		bound, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		if err := clock.BlockUntilWaiters(bound, 1); err != nil {
			t.Fatalf("Wait never slept: %v", err)
		}
		cancel()
		select {
		case r := <-done:
			if !errors.Is(r.err, context.Canceled) || r.job == nil || r.job.State != client.StateQueued {
				t.Errorf("Wait = %+v, %v; want the last job and context.Canceled", r.job, r.err)
			}
		case <-bound.Done():
			t.Fatal("Wait did not return after cancellation")
		}
		if n := len(srv.requests()); n != 1 {
			t.Errorf("server saw %d polls, want 1", n)
		}
	})
	t.Run("cancelled before the first poll", func(t *testing.T) {
		srv := newScripted(t, jobIn(client.StateQueued, 0))
		c, _ := newClient(t, srv.Server)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := c.Wait(ctx, "j-1"); !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
	})
}
