package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/retry/retrytest"
)

// fakeIngress imitates the parts of a Sluice ingress the examples use: the job API, and a
// rate-limited route that refuses its first request with 429.
func fakeIngress() *httptest.Server {
	var mu sync.Mutex
	polls, orders := 0, 0
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/queues/{queue}/jobs", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/v1/jobs/job-1")
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, `{"id":"job-1","queue":%q,"state":"queued","status_url":"/v1/jobs/job-1"}`, r.PathValue("queue"))
	})
	mux.HandleFunc("GET /v1/jobs/{id}", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		polls++
		state, attempts := []string{"queued", "running", "succeeded"}[min(polls-1, 2)], min(polls-1, 1)
		mu.Unlock()
		fmt.Fprintf(w, `{"id":%q,"queue":"orders","state":%q,"attempts":%d,"response":{"status":201}}`, r.PathValue("id"), state, attempts)
	})
	mux.HandleFunc("POST /api/orders", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		orders++
		first := orders == 1
		mu.Unlock()
		w.Header().Set("RateLimit-Policy", `"orders-per-key";q=10;w=1`)
		if first {
			w.Header().Set("RateLimit", `"orders-per-key";r=0;t=1`)
			w.Header().Set("Retry-After", "1")
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"title":"Too Many Requests","violated-policies":["orders-per-key"]}`)
			return
		}
		w.Header().Set("RateLimit", `"orders-per-key";r=9;t=1`)
		io.WriteString(w, "order accepted")
	})
	return httptest.NewServer(mux)
}

// Submit a deferred job and wait for its delivery.
func ExampleClient_Submit() {
	srv := fakeIngress()
	defer srv.Close()

	c, err := client.New(srv.URL,
		client.WithHeader("X-API-Key", "secret"),
		// Only for this example: a fake clock, so Wait's polling does not really sleep.
		client.WithClock(retrytest.NewAutoClock(time.Now())),
	)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	job, err := c.Submit(ctx, "orders", []byte(`{"sku":"A1","qty":2}`))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("submitted", job.ID, "to", job.Queue+":", job.State)

	job, err = c.Wait(ctx, job.ID)
	var failed *client.JobFailedError
	switch {
	case errors.As(err, &failed):
		fmt.Println("dead-lettered:", failed.Job.LastError)
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Printf("%s %s after %d attempt(s), upstream answered %d\n", job.ID, job.State, job.Attempts, job.Response.Status)
	}
	// Output:
	// submitted job-1 to orders: queued
	// job-1 succeeded after 1 attempt(s), upstream answered 201
}

// Send a request through the ingress; a 429 is waited out as the server asks, and the
// POST may be retried because it carries an Idempotency-Key.
func ExampleClient_Do() {
	srv := fakeIngress()
	defer srv.Close()

	clock := retrytest.NewAutoClock(time.Now()) // only for this example: waits take no time
	c, err := client.New(srv.URL, client.WithClock(clock))
	if err != nil {
		log.Fatal(err)
	}

	req, err := http.NewRequest(http.MethodPost, "/api/orders", strings.NewReader(`{"sku":"A1"}`))
	if err != nil {
		log.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", client.NewIdempotencyKey())

	resp, err := c.Do(context.Background(), req)
	var limited *client.RateLimitedError
	switch {
	case errors.As(err, &limited):
		fmt.Println("still limited by", limited.Policies, "- retry after", limited.RetryAfter)
		return
	case err != nil:
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
	fmt.Println("waited", clock.Waits())

	rl := c.RateLimit()
	fmt.Printf("quota %s: %d of %d left, resets in %v\n", rl.Policy, rl.Remaining, rl.Limit, rl.Reset)
	// Output:
	// 200 order accepted
	// waited [1s]
	// quota orders-per-key: 9 of 10 left, resets in 1s
}
