package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// State is the state of a job.
type State string

// The states of a job. Succeeded, Failed and Canceled are final.
const (
	StateScheduled State = "scheduled" // waiting for its time (WithDelay, WithNotBefore)
	StateQueued    State = "queued"
	StateRunning   State = "running"
	StateRetrying  State = "retrying"
	StateSucceeded State = "succeeded"
	StateFailed    State = "failed"   // dead-lettered
	StateCanceled  State = "canceled" // canceled before delivery; it is never delivered
)

// Final reports whether s is a state a job never leaves (succeeded, failed or canceled).
func (s State) Final() bool { return s == StateSucceeded || s == StateFailed || s == StateCanceled }

// Priority orders a job among the waiting jobs of its queue (WithPriority).
type Priority string

// The priorities; workers take high jobs before normal ones before low ones, with a
// starvation guard for the lower ones (see docs/delivery.md).
const (
	PriorityHigh   Priority = "high"
	PriorityNormal Priority = "normal"
	PriorityLow    Priority = "low"
)

// Job is a deferred job as the ingress reports it. Submit fills ID, Queue, State, StatusURL, ETA
// and Replayed; Job and Wait fill the rest.
type Job struct {
	ID        string    `json:"id"`
	Queue     string    `json:"queue"`
	State     State     `json:"state"`
	Attempts  int       `json:"attempts"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// LastError describes the last failed delivery attempt, if any.
	LastError string `json:"last_error"`
	// Response is the upstream's answer to the last delivery attempt; nil before the first.
	Response *JobResponse `json:"response"`
	// StatusURL is where the job's state can be read (from the 202's body or Location).
	StatusURL string `json:"status_url"`
	// ETA is when the ingress estimates the job will be delivered, while it is queued: the
	// jobs ahead of it over the queue's effective rate (its tenant's share on a fair queue),
	// after any pause. An estimate, told anew on every read; nil when the ingress gave none
	// (the job is no longer queued, or the queue is paused with no end set).
	ETA *time.Time `json:"eta,omitempty"`
	// NotBefore is the time a scheduled job was submitted for (WithDelay, WithNotBefore);
	// nil for a job submitted without one.
	NotBefore *time.Time `json:"not_before,omitempty"`
	// Replayed is true when Submit's Idempotency-Key had been seen before: the ingress
	// returned the existing job instead of creating one (Idempotent-Replayed: true).
	Replayed bool `json:"-"`
}

// JobResponse is the upstream's response to a delivery attempt.
type JobResponse struct {
	Status int `json:"status"`
}

// SubmitOption configures one Submit call.
type SubmitOption func(*submitOptions)

type submitOptions struct {
	contentType    string
	idempotencyKey string
	delay          time.Duration
	notBefore      time.Time
	priority       Priority
}

// WithDelay schedules the job d from when the ingress accepts it (Sluice-Delay): it is
// scheduled until then, and never delivered sooner. Beyond the queue's max_delay (30 days by
// default) Submit returns a 400 *APIError. Do not combine it with WithNotBefore.
func WithDelay(d time.Duration) SubmitOption {
	return func(o *submitOptions) { o.delay = d }
}

// WithNotBefore schedules the job for t (Sluice-Not-Before): it is scheduled until then,
// and never delivered sooner; a t already past is no schedule. Do not combine it with
// WithDelay.
func WithNotBefore(t time.Time) SubmitOption {
	return func(o *submitOptions) { o.notBefore = t }
}

// WithPriority sets the job's priority (Sluice-Priority): high, normal (the default) or low.
func WithPriority(p Priority) SubmitOption {
	return func(o *submitOptions) { o.priority = p }
}

// WithContentType sets the Content-Type the job's body is delivered with (default
// application/json).
func WithContentType(ct string) SubmitOption {
	return func(o *submitOptions) { o.contentType = ct }
}

// WithIdempotencyKey sets the Idempotency-Key of the submission. Submitting twice with the
// same key within the ingress's dedupe window yields the same job (Job.Replayed is then
// true). Without this option Submit generates a random key per call.
func WithIdempotencyKey(key string) SubmitOption {
	return func(o *submitOptions) { o.idempotencyKey = key }
}

// maxJobBody bounds the size of a job document read from the ingress.
const maxJobBody = 1 << 20

// Submit enqueues body as a job on queue (POST /v1/queues/{queue}/jobs) and returns the job
// as accepted. The request always carries an Idempotency-Key — the given one or a fresh
// random one — and is retried under the client's policy with that same key on 429, 503 and
// transient transport errors, so a retry can never create a second job.
//
// Errors: a *RateLimitedError when the ingress kept refusing with 429 (queue full, rate
// limited) beyond the retry budget, an *APIError for other non-2xx answers (404 unknown
// queue, 400, 413, a final 503), a transport error, or ctx.Err().
func (c *Client) Submit(ctx context.Context, queue string, body []byte, opts ...SubmitOption) (*Job, error) {
	if queue == "" {
		return nil, errors.New("client: submit: empty queue name")
	}
	o := submitOptions{contentType: "application/json"}
	for _, opt := range opts {
		opt(&o)
	}
	if o.idempotencyKey == "" {
		o.idempotencyKey = NewIdempotencyKey()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint("v1", "queues", queue, "jobs"), bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("client: submit to %q: %w", queue, err)
	}
	req.Header.Set("Content-Type", o.contentType)
	req.Header.Set("Idempotency-Key", o.idempotencyKey)
	req.Header.Set("Accept", "application/json")
	if o.delay != 0 {
		req.Header.Set("Sluice-Delay", o.delay.String())
	}
	if !o.notBefore.IsZero() {
		req.Header.Set("Sluice-Not-Before", o.notBefore.UTC().Format(time.RFC3339Nano))
	}
	if o.priority != "" {
		req.Header.Set("Sluice-Priority", string(o.priority))
	}

	resp, err := c.Do(ctx, req) // its errors name the URL or are typed: not wrapped again
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, apiError(resp)
	}
	var job Job
	if err := decodeJSON(resp, &job); err != nil {
		return nil, fmt.Errorf("client: submit to %q: %w", queue, err)
	}
	job.Replayed = strings.EqualFold(resp.Header.Get("Idempotent-Replayed"), "true")
	if job.StatusURL == "" {
		job.StatusURL = resp.Header.Get("Location")
	}
	return &job, nil
}

// Job returns the current state of the job id (GET /v1/jobs/{id}). It returns an error
// matching ErrJobNotFound for an unknown id, an *APIError for other non-2xx answers,
// a *RateLimitedError, a transport error or ctx.Err(). Throttled reads are retried as in Do.
func (c *Client) Job(ctx context.Context, id string) (*Job, error) {
	if id == "" {
		return nil, errors.New("client: job: empty id")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.endpoint("v1", "jobs", id), nil)
	if err != nil {
		return nil, fmt.Errorf("client: job %q: %w", id, err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.Do(ctx, req)
	if err != nil {
		return nil, err
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		drain(resp.Body)
		return nil, fmt.Errorf("%w: %q", ErrJobNotFound, id)
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return nil, apiError(resp)
	}
	var job Job
	if err := decodeJSON(resp, &job); err != nil {
		return nil, fmt.Errorf("client: job %q: %w", id, err)
	}
	return &job, nil
}

// Wait polls the job id until it reaches a final state and returns it: with a nil error when
// it succeeded, with a *JobFailedError when it failed (dead-lettered), with an error matching
// ErrJobCanceled when it was canceled. Polls are spaced by the poll policy (see
// WithPollPolicy), starting over at its initial delay whenever the job's state changes; a
// scheduled job is not polled again before its time.
//
// Wait returns early, with the last job it saw (nil if none), on any error of Job — such as
// ErrJobNotFound — and with ctx.Err() when ctx is done, which interrupts a wait at once.
func (c *Client) Wait(ctx context.Context, id string) (*Job, error) {
	var last *Job
	pace := c.poll
	pace.MaxAttempts, pace.MaxElapsed = 0, 0 // Wait is bounded by its context alone
	b := pace.Backoff(c.clock)
	for {
		job, err := c.Job(ctx, id)
		if err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				return last, ctxErr
			}
			return last, err
		}
		switch job.State {
		case StateSucceeded:
			return job, nil
		case StateFailed:
			return job, &JobFailedError{Job: job}
		case StateCanceled:
			return job, fmt.Errorf("%w: %s", ErrJobCanceled, id)
		}
		if last != nil && last.State != job.State {
			b.Reset()
		}
		last = job
		var floor time.Duration
		if job.State == StateScheduled && job.NotBefore != nil {
			// Nothing happens to it before its time.
			floor = job.NotBefore.Sub(c.clock.Now())
		}
		if err := b.Wait(ctx, floor); err != nil {
			return last, err
		}
	}
}

func decodeJSON(resp *http.Response, v any) error {
	defer drain(resp.Body)
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxJobBody)).Decode(v); err != nil {
		return fmt.Errorf("decoding the %d response: %w", resp.StatusCode, err)
	}
	return nil
}
