package ingress

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/httphdr"
	"github.com/sluice-rl/sluice/jsonw"
	"github.com/sluice-rl/sluice/queue"
)

// Enqueuer is the queue layer as the ingress uses it: mostly a [queue.Publisher], with a
// queue's Info and its tenants' ids. The processes give it a *queue.Queues behind an outage
// breaker (internal/app).
type Enqueuer interface {
	// Publish stores job and returns once the queue acknowledged it. It returns an error
	// wrapping queue.ErrFull, queue.ErrTenantFull, queue.ErrBudgetFull, queue.ErrUnknownQueue
	// or queue.ErrTooLarge when the job is
	// refused, and any other error when it could not be stored.
	Publish(ctx context.Context, job *queue.Job) (queue.Receipt, error)
	// Status returns the status of job id, or an error wrapping queue.ErrNotFound.
	Status(ctx context.Context, id string) (queue.Status, error)
	// Info describes queue name; the ingress reads its depth to compute Retry-After when
	// the queue is full.
	Info(ctx context.Context, name string) (queue.Info, error)
	// TenantID returns the tenant id of a tenant's key parts' values, key, keyed with the
	// deployment's id secret ([queue.IDs.TenantID]), or an error when it cannot be derived
	// yet (the ingress answers 503, as for a publish that fails).
	TenantID(key []byte) (string, error)
	// Backlog reads what waits in queue name ([queue.Publisher.Backlog]); the ingress reads it
	// at most once a second per queue, for eta and tenant_max_depth. It should fail at once,
	// not wait, while the queue is known to be unreachable.
	Backlog(ctx context.Context, name string) (queue.Backlog, error)
	// Place tells where a queued job stands ([queue.Publisher.Place]), for the eta of its status.
	Place(ctx context.Context, st queue.Status) (queue.Place, error)
}

// Accepted is the body of a 202 answer: the job a request became.
type Accepted struct {
	ID        string      `json:"id"`
	Queue     string      `json:"queue"`
	State     queue.State `json:"state"`
	StatusURL string      `json:"status_url"`
	// ETA is when the job is estimated to be delivered, while it waits (see jobStatus); nil
	// when there is no estimate.
	ETA *time.Time `json:"eta,omitempty"`
}

// jobStatus is the body of GET /v1/jobs/{id}: the job's status and, while it is queued, ETA,
// the estimated delivery time: the jobs ahead of it (in a fair queue, of its tenant) over the
// queue's effective rate (the tenant's share), after any pause; recomputed on every read from
// a reading of the queue at most a second old. An estimate: the rate, the share and the
// backlog move.
type jobStatus struct {
	queue.Status
	ETA *time.Time `json:"eta,omitempty"`
}

// JobPath returns the path of the status resource of job id: "/v1/jobs/{id}".
func JobPath(id string) string { return "/v1/jobs/" + id }

// Idempotency-Key limits: 1 to 255 printable ASCII characters.
const maxIdempotencyKey = 255

// validIdempotencyKey reports whether k is 1 to 255 printable ASCII characters.
func validIdempotencyKey(k string) bool {
	if k == "" || len(k) > maxIdempotencyKey {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

var errBadIdempotencyKey = badRequest("invalid Idempotency-Key", "the Idempotency-Key header must be 1 to 255 printable ASCII characters")

// deferRequest sends the request to the queue of rule ru and answers 202. The request keeps
// its method, path, query, replayable headers and body. A valid Idempotency-Key header makes
// the deferral idempotent, as for direct submissions; an invalid one is ignored here (the
// request was not addressed to Sluice).
func (g *gate) deferRequest(c echo.Context, rs *ruleSet, ru *rule) error {
	r := c.Request()
	q := rs.queues[ru.queue]
	body, err := readBody(c, q)
	if err != nil {
		return g.respondError(c, err)
	}
	job := &queue.Job{
		Queue:  q.Name,
		Method: r.Method,
		Path:   r.URL.EscapedPath(),
		Header: replayHeader(r.Header),
		Body:   body,
	}
	// The forwarding headers this hop would have sent had it forwarded the request now: the
	// worker replays them, so the upstream still learns the client's address.
	setForwarding(job.Header, r)
	if r.URL.RawQuery != "" {
		job.Path += "?" + r.URL.RawQuery
	}
	if k := r.Header.Get("Idempotency-Key"); validIdempotencyKey(k) {
		job.IdempotencyKey = k
	}
	if job.Tenant, err = g.tenantOf(rs, q, r); err != nil {
		return g.respondError(c, err)
	}
	if job.Cost, err = jobCost(q, r, body); err != nil {
		return g.respondError(c, err)
	}
	if job.Costs, err = jobCosts(q, r, body); err != nil {
		return g.respondError(c, err)
	}
	job.Priority = rulePriority(q, ru.name)
	// The rule's deferral budget: one key's waiting requests, at most waitingPerKey.
	req := request{r: r, trusted: rs.trusted, v6bits: rs.v6bits}
	job.Budget = &queue.Budget{Name: ru.name, Key: string(ru.appendKey(nil, &req)), PerKey: ru.waitingPerKey}
	if err := g.publish(c, q, job); err != nil {
		return g.respondError(c, err)
	}
	ru.counters[OutcomeEnqueued].Inc()
	return nil
}

// publish publishes job and answers 202, or returns the error to answer.
func (g *gate) publish(c echo.Context, q *config.Queue, job *queue.Job) error {
	if g.enqueuer == nil {
		return &publishError{queue: q.Name, err: errNoEnqueuer}
	}
	// The job is stored or not whatever the client does meanwhile; Publish bounds the call
	// itself when ctx has no deadline.
	ctx := context.WithoutCancel(c.Request().Context())
	o := g.outlook(q)
	o.refresh(ctx, g, q)
	if err := o.admit(g.now(), q, job.Tenant); err != nil {
		return err
	}
	var span trace.Span
	if g.tr.On() {
		span = g.startEnqueue(ctx, job)
	}
	rcpt, err := g.enqueuer.Publish(ctx, job)
	if span != nil {
		endEnqueue(span, job, rcpt, err)
	}
	o.settle(q, job.Tenant, rcpt.Seq) // 0 unless stored
	switch {
	case err == nil:
	case errors.Is(err, queue.ErrFull):
		return &queueFullError{queue: q.Name, maxDepth: q.MaxDepth, maxBytes: q.MaxBytes, retryAfter: g.drainSeconds(ctx, q)}
	case errors.Is(err, queue.ErrTenantFull):
		// The ledger's exact refusal: the tenant's waiting and scheduled jobs together.
		return &tenantFullError{queue: q.Name, maxDepth: q.TenantMaxDepth,
			retryAfter: o.waitFor(g.now(), q, job.Tenant, q.TenantMaxDepth)}
	case errors.Is(err, queue.ErrBudgetFull):
		return &budgetFullError{rule: job.Budget.Name, queue: q.Name, perKey: job.Budget.PerKey,
			retryAfter: o.waitFor(g.now(), q, "", job.Budget.PerKey)}
	case errors.Is(err, queue.ErrUnknownQueue), errors.Is(err, queue.ErrTooLarge), errors.Is(err, queue.ErrIdempotencyMismatch):
		return err
	default:
		g.quiet.error(g.log, g.now(), q.Name, "ingress: enqueue failed; the deferral answered 503", "queue", q.Name, "err", err)
		return &publishError{queue: q.Name, err: err}
	}
	a := &Accepted{ID: rcpt.ID, Queue: q.Name, State: queue.StateQueued, StatusURL: JobPath(rcpt.ID)}
	if !job.NotBefore.IsZero() && !rcpt.Replayed {
		a.State, a.ETA = queue.StateScheduled, utcMillis(job.NotBefore)
		writeAccepted(c.Response(), a)
		return nil
	}
	if rcpt.Replayed {
		c.Response().Header().Set("Idempotent-Replayed", "true")
		if st, err := g.enqueuer.Status(ctx, rcpt.ID); err == nil {
			a.State, a.ETA = st.State, g.etaOf(ctx, q, st)
		}
	} else if eta, ok := o.etaStored(g.now(), q, job.Tenant, rcpt); ok {
		a.ETA = utcMillis(eta)
	}
	writeAccepted(c.Response(), a)
	return nil
}

// etaOf is the eta of job st of queue q while it is queued, or nil: where it stands (one or
// two reads), against q's reading.
func (g *gate) etaOf(ctx context.Context, q *config.Queue, st queue.Status) *time.Time {
	if st.State == queue.StateScheduled && st.NotBefore != nil {
		return utcMillis(*st.NotBefore) // its time; the backlog then is not known yet
	}
	if st.State != queue.StateQueued {
		return nil
	}
	p, err := g.enqueuer.Place(ctx, st)
	if err != nil {
		return nil
	}
	o := g.outlook(q)
	o.refresh(ctx, g, q)
	eta, ok := o.etaPlace(g.now(), q, st.Tenant, p)
	if !ok {
		return nil
	}
	return utcMillis(eta)
}

// utcMillis is t in UTC, rounded to the millisecond: an estimate has no use for more.
func utcMillis(t time.Time) *time.Time {
	t = t.UTC().Round(time.Millisecond)
	return &t
}

// acceptedType is the Content-Type of a 202, as a header value that is never written to.
var acceptedType = []string{echo.MIMEApplicationJSON}

// writeAccepted answers 202 with a's JSON, with a Location of its status URL.
func writeAccepted(w http.ResponseWriter, a *Accepted) {
	bp := bufs.Get().(*[]byte)
	body := append(a.appendJSON((*bp)[:0]), '\n') // the newline encoding/json's Encoder writes
	h := w.Header()
	h["Content-Type"] = acceptedType[:1:1]
	h["Location"] = []string{a.StatusURL}
	w.WriteHeader(http.StatusAccepted)
	w.Write(body)
	*bp = body
	bufs.Put(bp)
}

// appendJSON appends a as JSON to dst, byte for byte what encoding/json's Marshal writes
// for it, without reflection.
func (a *Accepted) appendJSON(dst []byte) []byte {
	dst = append(dst, `{"id":`...)
	dst = jsonw.AppendString(dst, a.ID)
	dst = append(dst, `,"queue":`...)
	dst = jsonw.AppendString(dst, a.Queue)
	dst = append(dst, `,"state":`...)
	dst = jsonw.AppendString(dst, string(a.State))
	dst = append(dst, `,"status_url":`...)
	dst = jsonw.AppendString(dst, a.StatusURL)
	if a.ETA != nil {
		dst = append(dst, `,"eta":"`...)
		dst = a.ETA.AppendFormat(dst, time.RFC3339Nano)
		dst = append(dst, '"')
	}
	return append(dst, '}')
}

// drainSeconds is how long the backlog of a full queue takes to drain at its rate: the
// Retry-After of a 429 for a full queue, at least 1 second.
func (g *gate) drainSeconds(ctx context.Context, q *config.Queue) int64 {
	depth := g.fullDepth(ctx, q)
	if q.Rate.N <= 0 || q.Rate.Per <= 0 || depth <= 0 {
		return 1
	}
	secs := math.Ceil(float64(depth) * q.Rate.Per.Seconds() / float64(q.Rate.N))
	return max(int64(min(secs, math.MaxInt32)), 1)
}

// depthSeen is a full queue's depth and when it was read.
type depthSeen struct {
	depth int64
	at    time.Time
}

// fullDepth is the depth of full queue q (its max_depth when it cannot be read), read from
// NATS at most once a second per queue: a flood against a full queue would otherwise cost
// NATS a round trip per refused request (a 429 path at 3 873 req/s where it ran at 30 000).
func (g *gate) fullDepth(ctx context.Context, q *config.Queue) int64 {
	now := g.now()
	if v, ok := g.fullDepths.Load(q.Name); ok {
		if d := v.(depthSeen); now.Sub(d.at) < time.Second && !now.Before(d.at) {
			return d.depth
		}
	}
	depth := q.MaxDepth
	ictx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if info, err := g.enqueuer.Info(ictx, q.Name); err == nil && info.Depth > 0 {
		depth = int64(min(info.Depth, math.MaxInt64))
	}
	g.fullDepths.Store(q.Name, depthSeen{depth: depth, at: now})
	return depth
}

// readBody reads the request body, at most q's max_body_bytes (0: no limit of its own); a
// longer body is a *bodyTooLargeError.
func readBody(c echo.Context, q *config.Queue) ([]byte, error) {
	r := c.Request()
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	body := r.Body // left in place: a failure to read it is answered from it (bodyProblem)
	limit := q.MaxBodyBytes
	if limit > 0 {
		if r.ContentLength > limit {
			return nil, &bodyTooLargeError{queue: q.Name, limit: limit}
		}
		body = http.MaxBytesReader(c.Response(), body, limit)
	}
	b, err := io.ReadAll(body)
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return nil, &bodyTooLargeError{queue: q.Name, limit: limit}
	}
	return b, err
}

// replayHeader returns the headers of a deferred request that a worker replays: the
// end-to-end headers, without the hop-by-hop ones and those Connection names
// (httphdr.RemoveHopByHop), Host, Content-Length, Expect, and the forwarding headers
// (Forwarded, X-Forwarded-*), which the ingress writes anew for this hop (setForwarding).
func replayHeader(h http.Header) http.Header {
	// A copy of what stays, rather than a clone less what goes: 0.45 against 0.63µs for a
	// browser's headers (one of the defer path's ~30µs).
	out := make(http.Header, len(h))
	named := httphdr.ConnectionNames(h)
	for name, vs := range h {
		switch {
		case httphdr.IsHopByHop(name), slices.Contains(named, name),
			name == "Host", name == "Content-Length", name == "Expect", name == "Forwarded",
			strings.HasPrefix(name, "X-Forwarded-"):
			continue
		}
		out[name] = append([]string(nil), vs...)
	}
	return out
}

// respondError writes the problem for err, as the Server's error handler would.
func (g *gate) respondError(c echo.Context, err error) error {
	p := bodyProblem(c.Request())
	if p != nil {
		g.metrics.countBodyProblem(p)
	} else {
		p = problemFor(err)
	}
	writeProblem(c.Response(), p)
	return nil
}

// submitJob serves POST /v1/queues/{queue}/jobs: a job for the queue's target, with the
// request body as is and its Content-Type.
func (s *Server) submitJob(c echo.Context) error {
	name := c.Param("queue")
	rs := s.gate.rules.Load()
	q, ok := rs.queues[name]
	if !ok {
		return &Problem{Type: "about:blank", Title: "Unknown queue", Status: http.StatusNotFound,
			Detail: fmt.Sprintf("no queue named %q", name)}
	}
	if q.Target == nil {
		return &Problem{Type: "about:blank", Title: "Unknown queue", Status: http.StatusNotFound,
			Detail: fmt.Sprintf("queue %q has no target, so it takes no jobs directly", name)}
	}
	r := c.Request()
	job := &queue.Job{Queue: name, Direct: true, Header: http.Header{}}
	if k, ok := r.Header["Idempotency-Key"]; ok {
		if len(k) != 1 || !validIdempotencyKey(k[0]) {
			return errBadIdempotencyKey
		}
		job.IdempotencyKey = k[0]
	}
	for _, h := range []string{"Content-Type", "Content-Encoding", "Content-Language"} {
		if v := r.Header.Values(h); len(v) > 0 {
			job.Header[h] = append([]string(nil), v...)
		}
	}
	var err error
	if job.NotBefore, err = notBefore(r, q, s.gate.now()); err != nil {
		return err
	}
	if job.Priority, err = priorityOf(r); err != nil {
		return err
	}
	if job.Priority != queue.PriorityNormal && !q.Priorities && !q.Fair {
		return badRequest("priorities not enabled", fmt.Sprintf("queue %q takes no %s; its config needs priorities: true", name, hdrPriority))
	}
	if job.Tenant, err = s.gate.tenantOf(rs, q, r); err != nil {
		return err
	}
	asked := job.Priority
	if job.Priority, err = s.gate.claimPriority(q, r, job.Tenant, job.Priority); err != nil {
		return err
	}
	if job.Priority != asked { // a claim of high not granted: say at what level it waits
		c.Response().Header().Set(hdrPriority, "normal")
	}
	body, err := readBody(c, q)
	if err != nil {
		return err
	}
	job.Body = body
	if job.Cost, err = jobCost(q, r, body); err != nil {
		return err
	}
	if job.Costs, err = jobCosts(q, r, body); err != nil {
		return err
	}
	return s.gate.publish(c, q, job)
}

// tenantOf returns the tenant of a request to queue q: "" for a queue without tenant key
// parts, else the tenant id of the parts' values (Enqueuer.TenantID: keyed with the id secret,
// so the values, API keys among them, are never stored, and their ids cannot be computed from
// them). It returns a 400 problem when a part's header or query parameter is repeated with
// different values, and a *publishError (503) when the id cannot be derived yet.
func (g *gate) tenantOf(rs *ruleSet, q *config.Queue, r *http.Request) (string, error) {
	id, _, err := g.tenant(rs, q, r)
	return id, err
}

// tenant is tenantOf, with the tenant key parts' values it derived the id from (nil for a
// queue without tenant parts).
func (g *gate) tenant(rs *ruleSet, q *config.Queue, r *http.Request) (id string, key []byte, err error) {
	if len(q.Tenant) == 0 {
		return "", nil, nil
	}
	req := request{r: r, trusted: rs.trusted, v6bits: rs.v6bits}
	key = appendParts(nil, q.Tenant, &req)
	if req.conflict != "" {
		return "", nil, badRequest("ambiguous tenant", "the "+req.conflict+" appears several times with different values; send it once")
	}
	if g.enqueuer == nil {
		return "", nil, &publishError{queue: q.Name, err: errNoEnqueuer}
	}
	if id, err = g.enqueuer.TenantID(key); err != nil {
		return "", nil, &publishError{queue: q.Name, err: err}
	}
	return id, key, nil
}

// legacyTenantID is the tenant id that versions before tenant ids were keyed with the id
// secret gave the values key: the unsalted SHA-256, which anyone can compute from an API key.
// Only getJob uses it, so that a tenant still reads the status of its jobs accepted before the
// upgrade (their records carry it, for job_retention); nothing new is stored under it, and
// the admin API never derives it. Remove it one job_retention after every deployment upgraded.
func legacyTenantID(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:16])
}

// getJob serves GET /v1/jobs/{id}.
func (s *Server) getJob(c echo.Context) error {
	if s.gate.enqueuer == nil {
		return queue.ErrNotFound
	}
	id := c.Param("id")
	if !validJobID(id) {
		return queue.ErrNotFound
	}
	st, err := s.gate.enqueuer.Status(c.Request().Context(), id)
	if err != nil {
		if errors.Is(err, queue.ErrNotFound) {
			return err
		}
		s.gate.log.Error("ingress: job status", "id", id, "err", err)
		return &statusError{err: err}
	}
	// Another tenant's job does not exist, as far as this caller can tell.
	rs := s.gate.rules.Load()
	if q, ok := rs.queues[st.Queue]; ok || st.Tenant != "" {
		var asker string
		var key []byte
		var aerr error
		if ok {
			asker, key, aerr = s.gate.tenant(rs, q, c.Request())
		}
		mine := aerr == nil && (asker == st.Tenant || key != nil && legacyTenantID(key) == st.Tenant)
		if !mine {
			return fmt.Errorf("%w: %s", queue.ErrNotFound, id)
		}
	}
	out := jobStatus{Status: st}
	if q, ok := rs.queues[st.Queue]; ok {
		out.ETA = s.gate.etaOf(c.Request().Context(), q, st)
	}
	return c.JSON(http.StatusOK, out)
}

// validJobID reports whether id has the form of a job id: 1 to 128 of A-Z, a-z, 0-9, "_"
// and "-". Others cannot exist, and are not looked up.
func validJobID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// errNoEnqueuer is the answer to a deferral when no queue layer is configured.
var errNoEnqueuer = errors.New("ingress: no queue layer configured")
