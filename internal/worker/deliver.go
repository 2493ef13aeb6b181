package worker

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/sluice-rl/sluice/internal/cost"
	"github.com/sluice-rl/sluice/internal/httphdr"
	"github.com/sluice-rl/sluice/internal/tracing"
	"github.com/sluice-rl/sluice/queue"
)

// The headers every delivery carries.
const (
	// HeaderIdempotencyKey carries the client's own Idempotency-Key, scoped to the job's tenant
	// ([queue.UpstreamKey]), when its request carried a valid one, and the job id otherwise, so
	// that the upstream recognises a redelivery, and a request first forwarded and then, on the
	// client's retry, deferred, under one key, and never takes two tenants' keys for one.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderJob carries the job id.
	HeaderJob = "Sluice-Job"
	// HeaderAttempt carries the attempt number, from 1.
	HeaderAttempt = "Sluice-Attempt"
)

// maxDrain is how much of a response body is read to keep the connection reusable.
const maxDrain = 64 << 10

// routeError means the job cannot be delivered by this queue's config: a direct job without a
// target, or a deferred job without an upstream. It is permanent.
type routeError struct{ msg string }

func (e *routeError) Error() string { return e.msg }

// request builds the HTTP request of one delivery attempt.
func request(ctx context.Context, cfg *QueueConfig, j *queue.Job, attempt int) (*http.Request, error) {
	var method, url string
	header := http.Header{}
	if j.Direct {
		if cfg.Target == nil {
			return nil, &routeError{"queue " + cfg.Name + " has no target for directly submitted jobs"}
		}
		method, url = cfg.Target.Method, cfg.Target.URL
		if ct := j.Header.Get("Content-Type"); ct != "" {
			header.Set("Content-Type", ct)
		}
	} else {
		if cfg.Upstream == "" {
			return nil, &routeError{"no upstream configured for deferred requests"}
		}
		method = j.Method
		if method == "" {
			method = http.MethodGet
		}
		path := j.Path
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		url = strings.TrimSuffix(cfg.Upstream, "/") + path
		header = j.Header.Clone()
		if header == nil {
			header = http.Header{}
		}
		// A deferred request's hop-by-hop headers described the client's connection, not the
		// request; Content-Length is recomputed and Host is the upstream's.
		httphdr.RemoveHopByHop(header)
		header.Del("Content-Length")
		header.Del("Host")
		// Sluice-* headers are Sluice's own: a client's are never passed on as such.
		for k := range header {
			if len(k) > len("Sluice-") && strings.EqualFold(k[:len("Sluice-")], "Sluice-") {
				delete(header, k)
			}
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(j.Body))
	if err != nil {
		return nil, &routeError{"build request: " + err.Error()}
	}
	req.Header = header
	key := queue.UpstreamKey(j.Tenant, j.IdempotencyKey)
	if key == "" {
		key = j.ID
	}
	req.Header.Set(HeaderIdempotencyKey, key)
	req.Header.Set(HeaderJob, j.ID)
	req.Header.Set(HeaderAttempt, strconv.Itoa(attempt))
	return req, nil
}

// deliver makes one delivery attempt, bounded by cfg.Timeout and by ctx, and returns the
// response with its body already read (up to maxDrain) and closed. For a queue that reads
// its true cost from a JSON answer (readsCostBody) it returns up to maxCostBody of the body,
// or, for a streamed answer, the Stream that read its usage events (readCostBody);
// otherwise body and st are nil and nothing is kept.
func (r *runner) deliver(ctx context.Context, cfg *QueueConfig, j *queue.Job, attempt int) (_ *http.Response, body []byte, st *cost.Stream, _ error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	req, err := request(ctx, cfg, j, attempt)
	if err != nil {
		return nil, nil, nil, err
	}
	if r.p.tr.On() {
		tracing.Inject(ctx, req.Header) // the delivery span's, over any the job's headers hold
	}
	resp, err := r.p.do(req)
	if err != nil {
		return nil, nil, nil, err
	}
	if readsCostBody(cfg) {
		body, st, err = readCostBody(cfg, resp)
		if err == nil {
			_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
		}
	} else {
		_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
	}
	resp.Body.Close()
	if err != nil && ctx.Err() != nil {
		// The status arrived, but the body did not in time: a timeout all the same.
		return nil, nil, nil, ctx.Err()
	}
	return resp, body, st, nil
}
