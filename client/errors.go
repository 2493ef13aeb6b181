package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/retry"
)

var (
	// ErrJobNotFound is returned by Job and Wait when the ingress does not know the job id
	// (404). Test with errors.Is.
	ErrJobNotFound = errors.New("client: job not found")
	// ErrJobCanceled is returned by Wait, with the job, when the job was canceled before its
	// delivery. Test with errors.Is.
	ErrJobCanceled = errors.New("client: job canceled")
	// ErrRateLimited matches every *RateLimitedError under errors.Is.
	ErrRateLimited = errors.New("client: rate limited")
)

// APIError is a non-2xx answer of the Sluice job API, decoded from its
// application/problem+json body (RFC 9457) where there is one.
type APIError struct {
	// Status is the HTTP status code.
	Status int
	// Type, Title and Detail are the problem's members. Without a problem body, Title is the
	// status text and Detail the start of the body, if any.
	Type   string
	Title  string
	Detail string
}

func (e *APIError) Error() string {
	msg := fmt.Sprintf("client: %d %s", e.Status, e.Title)
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// RateLimitedError is returned when a request was refused with 429 Too Many Requests and no
// further retry was allowed: the method is not idempotent and has no Idempotency-Key, the
// attempts or the elapsed-time budget are spent, or the server's wait would end past the
// budget or the context's deadline. errors.Is(err, ErrRateLimited) holds for it.
type RateLimitedError struct {
	// RetryAfter is how long the server asked to wait (see retry.FromHeaders); zero when it
	// did not say.
	RetryAfter time.Duration
	// Policies are the names of the violated rate-limit rules, from the problem+json member
	// "violated-policies".
	Policies []string
	// Status is the HTTP status code (429).
	Status int
	// Detail is the problem's detail, if any.
	Detail string
}

func (e *RateLimitedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "client: rate limited (%d)", e.Status)
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, ", retry after %v", e.RetryAfter)
	}
	if len(e.Policies) > 0 {
		fmt.Fprintf(&b, ", policies %s", strings.Join(e.Policies, ", "))
	}
	if e.Detail != "" {
		b.WriteString(": " + e.Detail)
	}
	return b.String()
}

// Is makes errors.Is(err, ErrRateLimited) true.
func (e *RateLimitedError) Is(target error) bool { return target == ErrRateLimited }

// JobFailedError is returned by Wait, together with the job, when the job ended in the
// failed state (dead-lettered). Use errors.As to reach the job.
type JobFailedError struct {
	Job *Job
}

func (e *JobFailedError) Error() string {
	msg := fmt.Sprintf("client: job %s in queue %q failed after %d attempts", e.Job.ID, e.Job.Queue, e.Job.Attempts)
	if e.Job.LastError != "" {
		msg += ": " + e.Job.LastError
	}
	return msg
}

// problem is the subset of an RFC 9457 problem document Sluice sends.
type problem struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Detail           string   `json:"detail"`
	ViolatedPolicies []string `json:"violated-policies"`
}

// readProblem reads (a bounded prefix of) resp's body, closes it and decodes a problem
// document; a body that is not JSON becomes the Detail.
func readProblem(resp *http.Response) problem {
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var p problem
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt == "application/problem+json" || mt == "application/json" {
		if json.Unmarshal(body, &p) == nil {
			return p
		}
	}
	p.Detail = strings.TrimSpace(string(body))
	if len(p.Detail) > 512 {
		p.Detail = strings.ToValidUTF8(p.Detail[:512], "") + "…"
	}
	return p
}

func apiError(resp *http.Response) *APIError {
	p := readProblem(resp)
	if p.Title == "" {
		p.Title = http.StatusText(resp.StatusCode)
	}
	return &APIError{Status: resp.StatusCode, Type: p.Type, Title: p.Title, Detail: p.Detail}
}

func rateLimitedError(resp *http.Response, out retry.Outcome) *RateLimitedError {
	p := readProblem(resp)
	e := &RateLimitedError{Policies: p.ViolatedPolicies, Status: resp.StatusCode, Detail: p.Detail}
	if out.HasWait {
		e.RetryAfter = out.Wait
	}
	return e
}
