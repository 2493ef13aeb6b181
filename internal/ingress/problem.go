package ingress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"

	"github.com/labstack/echo/v4"

	"github.com/sluice-rl/sluice/jsonw"
	"github.com/sluice-rl/sluice/queue"
)

// ProblemContentType is the media type of every error body the ingress writes (RFC 9457).
const ProblemContentType = "application/problem+json"

// QuotaExceededType is the problem type of a 429 for a rate limit, as registered with IANA.
const QuotaExceededType = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// Problem is an RFC 9457 problem detail: the body of every error response of the ingress, and
// an error that carries its own status. Handlers return a *Problem (or any error, which
// bodyTooLargeError is a request body over the max_body_bytes of the queue it may go to.
type bodyTooLargeError struct {
	queue string
	limit int64
}

func (e *bodyTooLargeError) Error() string {
	return fmt.Sprintf("request body over max_body_bytes %d of queue %q", e.limit, e.queue)
}

// problemFor maps) and the error handler writes it.
type Problem struct {
	// Type is a URI naming the kind of problem; "" is written as "about:blank".
	Type string `json:"type"`
	// Title is a short summary of the kind of problem.
	Title string `json:"title"`
	// Status is the HTTP status code.
	Status int `json:"status"`
	// Detail explains this occurrence.
	Detail string `json:"detail,omitempty"`
	// ViolatedPolicies names the rules a request exceeded (quota-exceeded problems only).
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
	// RetryAfter is the delay in whole seconds after which a retry may succeed, also sent as
	// the Retry-After header; 0: none.
	RetryAfter int64 `json:"retry_after,omitempty"`
}

// Error returns the title and detail.
func (p *Problem) Error() string {
	if p.Detail == "" {
		return fmt.Sprintf("%d %s", p.Status, p.Title)
	}
	return fmt.Sprintf("%d %s: %s", p.Status, p.Title, p.Detail)
}

func badRequest(title, detail string) *Problem {
	return &Problem{Type: "about:blank", Title: title, Status: http.StatusBadRequest, Detail: detail}
}

// upstreamError is a failure to get a response from the upstream.
type upstreamError struct{ err error }

func (e *upstreamError) Error() string { return "upstream: " + e.err.Error() }
func (e *upstreamError) Unwrap() error { return e.err }

// publishError is a failure to publish a job that is not the client's fault (JetStream
// unreachable, timed out).
type publishError struct {
	queue string
	err   error
}

func (e *publishError) Error() string { return fmt.Sprintf("enqueue to %q: %v", e.queue, e.err) }
func (e *publishError) Unwrap() error { return e.err }

// statusError is a failure to read a job's status that is not the client's fault.
type statusError struct{ err error }

func (e *statusError) Error() string { return "job status: " + e.err.Error() }
func (e *statusError) Unwrap() error { return e.err }

// queueFullError is a queue at its max_depth or max_bytes, with the seconds its backlog needs
// to drain.
type queueFullError struct {
	queue              string
	maxDepth, maxBytes int64
	retryAfter         int64
}

func (e *queueFullError) Error() string { return fmt.Sprintf("queue %q is full", e.queue) }

// tenantFullError is a tenant of a fair queue holding its tenant_max_depth jobs waiting, with
// the seconds its share of the rate needs to make room for one more.
type tenantFullError struct {
	queue      string
	maxDepth   int64
	retryAfter int64
}

// budgetFullError is a key of a deferring rule holding its max_waiting_per_key jobs waiting,
// with the seconds that many jobs take at the queue's rate.
type budgetFullError struct {
	rule, queue string
	perKey      int64
	retryAfter  int64
}

func (e *budgetFullError) Error() string {
	return fmt.Sprintf("the key holds max_waiting_per_key %d jobs of rule %q waiting in queue %q", e.perKey, e.rule, e.queue)
}

func (e *tenantFullError) Error() string {
	return fmt.Sprintf("the tenant holds tenant_max_depth %d jobs in queue %q", e.maxDepth, e.queue)
}

// admissionProblem is the 429 of a job the queue's admission refused (its depth or bytes, its
// tenant's depth, its key's deferral budget), or nil for any other error.
func admissionProblem(err error) *Problem {
	var (
		full  *queueFullError
		tfull *tenantFullError
		bfull *budgetFullError
	)
	switch {
	case errors.As(err, &full):
		bytes := fmt.Sprintf("max_bytes %d bytes", full.maxBytes)
		if full.maxBytes == 0 {
			bytes = "no max_bytes: the NATS servers' store limit, shared by every queue"
		}
		return &Problem{Type: "about:blank", Title: "Queue is full", Status: http.StatusTooManyRequests,
			Detail: fmt.Sprintf("queue %q holds as many jobs as it may (max_depth %d jobs, %s); retry once its backlog has drained",
				full.queue, full.maxDepth, bytes),
			RetryAfter: full.retryAfter}
	case errors.As(err, &tfull):
		return &Problem{Type: "about:blank", Title: "Too many jobs waiting for this tenant", Status: http.StatusTooManyRequests,
			Detail: fmt.Sprintf("this tenant already holds %d jobs waiting in queue %q (its tenant_max_depth); other tenants' jobs are still accepted; retry once its backlog has moved on",
				tfull.maxDepth, tfull.queue),
			RetryAfter: tfull.retryAfter}
	case errors.As(err, &bfull):
		return &Problem{Type: "about:blank", Title: "Too many deferred requests waiting for this key", Status: http.StatusTooManyRequests,
			Detail: fmt.Sprintf("this key already has %d requests deferred by rule %q waiting in queue %q (its max_waiting_per_key); other keys' requests are still deferred; retry once they have been delivered",
				bfull.perKey, bfull.rule, bfull.queue),
			ViolatedPolicies: []string{bfull.rule},
			RetryAfter:       bfull.retryAfter}
	}
	return nil
}

// problemFor maps an error to the problem the client is sent. It is the one place that turns
// errors into HTTP statuses.
func problemFor(err error) *Problem {
	var (
		p      *Problem
		he     *echo.HTTPError
		mbe    *http.MaxBytesError
		ue     *upstreamError
		pe     *publishError
		big    *bodyTooLargeError
		se     *statusError
		netErr net.Error
	)
	if ap := admissionProblem(err); ap != nil {
		return ap
	}
	switch {
	case errors.As(err, &p):
		return p
	case errors.As(err, &big):
		return &Problem{Type: "about:blank", Title: "Request body too large", Status: http.StatusRequestEntityTooLarge,
			Detail: fmt.Sprintf("the request body is larger than %d bytes, the max_body_bytes of queue %q that this request may be deferred to", big.limit, big.queue)}
	case errors.Is(err, queue.ErrNoPriorities):
		return badRequest("priorities not enabled", "the queue takes no "+hdrPriority+"; its config needs priorities: true")
	case errors.As(err, &mbe), errors.Is(err, queue.ErrTooLarge):
		detail := "the request is larger than the queue's message store accepts (NATS max_payload)"
		if mbe != nil {
			detail = fmt.Sprintf("the request body is larger than %d bytes", mbe.Limit)
		}
		return &Problem{Type: "about:blank", Title: "Request body too large", Status: http.StatusRequestEntityTooLarge, Detail: detail}
	case errors.Is(err, queue.ErrIdempotencyMismatch):
		return &Problem{Type: "about:blank", Title: "Idempotency-Key reused", Status: http.StatusUnprocessableEntity,
			Detail: "this Idempotency-Key was already used for a different request (method, path or body) within the dedupe window"}
	case errors.Is(err, queue.ErrUnknownQueue):
		return &Problem{Type: "about:blank", Title: "Unknown queue", Status: http.StatusNotFound,
			Detail: "the queue is not configured (or no longer)"}
	case errors.Is(err, queue.ErrNotFound):
		return &Problem{Type: "about:blank", Title: "Job not found", Status: http.StatusNotFound, Detail: "no job has this id (it may have expired)"}
	case errors.As(err, &pe):
		return &Problem{Type: "about:blank", Title: "Queue unavailable", Status: http.StatusServiceUnavailable,
			Detail: fmt.Sprintf("the job could not be stored in queue %q; nothing was enqueued", pe.queue), RetryAfter: 1}
	case errors.As(err, &se):
		return &Problem{Type: "about:blank", Title: "Job status unavailable", Status: http.StatusServiceUnavailable,
			Detail: "the job store cannot be reached", RetryAfter: 1}
	case errors.As(err, &ue):
		if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) && netErr.Timeout() {
			return &Problem{Type: "about:blank", Title: "Upstream timed out", Status: http.StatusGatewayTimeout,
				Detail: "the upstream did not answer in time"}
		}
		return &Problem{Type: "about:blank", Title: "Upstream unavailable", Status: http.StatusBadGateway,
			Detail: "the upstream could not be reached or failed to answer"}
	case errors.As(err, &he):
		detail := ""
		if m, ok := he.Message.(string); ok && m != http.StatusText(he.Code) {
			detail = m
		}
		return &Problem{Type: "about:blank", Title: http.StatusText(he.Code), Status: he.Code, Detail: detail}
	default:
		return &Problem{Type: "about:blank", Title: "Internal server error", Status: http.StatusInternalServerError}
	}
}

// writeProblem writes p as the response.
func writeProblem(w http.ResponseWriter, p *Problem) {
	bp := bufs.Get().(*[]byte)
	body := p.appendJSON((*bp)[:0])
	retryAfter := ""
	if p.RetryAfter > 0 {
		retryAfter = itoa(p.RetryAfter)
	}
	writeProblemBody(w, p.Status, body, retryAfter)
	*bp = body
	bufs.Put(bp)
}

// bufs holds the buffers problem bodies are built in.
var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// writeProblemBody writes a problem+json response of status with body (which w must not
// retain, as io.Writer says), and a Retry-After header unless retryAfter is "".
func writeProblemBody(w http.ResponseWriter, status int, body []byte, retryAfter string) {
	hv := new(problemHeaders)
	hv[1] = itoa(int64(len(body)))
	h := w.Header()
	h["Content-Length"] = hv[1:2:2]
	setProblemHeaders(h, hv, status, retryAfter)
	w.WriteHeader(status)
	w.Write(body)
}

// setProblemHeaders sets the headers of a problem response but its Content-Length: the
// Content-Type, the Retry-After unless retryAfter is "", and Cache-Control: no-store where
// status is one a cache may store without being told (heuristically cacheable, RFC 9110
// §15.1: 404, 405, 410, 414, 501). Any other error status is never stored without explicit
// freshness (RFC 9111 §3), so saying no-store there would only add a header; a stale one (an
// upstream's, under an answer replaced) is removed. hv holds the values: each is assigned as a
// slice of one with a capacity of one, under its canonical name, so an append elsewhere
// copies instead of writing into hv.
func setProblemHeaders(h http.Header, hv *problemHeaders, status int, retryAfter string) {
	hv[0] = ProblemContentType
	h["Content-Type"] = hv[0:1:1]
	switch status {
	case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusGone, http.StatusRequestURITooLong,
		http.StatusNotImplemented:
		hv[2] = "no-store"
		h["Cache-Control"] = hv[2:3:3]
	default:
		delete(h, "Cache-Control")
	}
	if retryAfter != "" {
		hv[3] = retryAfter
		h[hdrRetryAfter] = hv[3:4:4]
	}
}

// problemHeaders are the values of the headers of a problem response: Content-Type,
// Content-Length, Cache-Control, Retry-After.
type problemHeaders [4]string

// QuotaBody is the problem+json body of a 429 for the rules named violated, to be retried in
// secs, as the HTTP path writes it: the rate-limit service's raw_body.
func QuotaBody(violated []string, secs int64) []byte {
	return (&Problem{
		Type:             QuotaExceededType,
		Title:            quotaTitle,
		Status:           http.StatusTooManyRequests,
		Detail:           quotaDetail(violated, secs),
		ViolatedPolicies: violated,
		RetryAfter:       secs,
	}).appendJSON(nil)
}

// appendJSON appends p as JSON to dst, byte for byte what encoding/json's Marshal writes
// for it (field order, omitempty, HTML-safe string escaping), without reflection.
func (p *Problem) appendJSON(dst []byte) []byte {
	dst = append(dst, `{"type":`...)
	dst = jsonw.AppendString(dst, p.Type)
	dst = append(dst, `,"title":`...)
	dst = jsonw.AppendString(dst, p.Title)
	dst = append(dst, `,"status":`...)
	dst = strconv.AppendInt(dst, int64(p.Status), 10)
	if p.Detail != "" {
		dst = append(dst, `,"detail":`...)
		dst = jsonw.AppendString(dst, p.Detail)
	}
	if len(p.ViolatedPolicies) > 0 {
		dst = append(dst, `,"violated-policies":[`...)
		for i, v := range p.ViolatedPolicies {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = jsonw.AppendString(dst, v)
		}
		dst = append(dst, ']')
	}
	if p.RetryAfter != 0 {
		dst = append(dst, `,"retry_after":`...)
		dst = strconv.AppendInt(dst, p.RetryAfter, 10)
	}
	return append(dst, '}')
}
