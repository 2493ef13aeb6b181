package queue

import (
	"errors"
	"net/http"
	"time"
)

// Job is the envelope of one deferred request or one directly submitted job. A Job is what
// [Publisher.Publish] stores and what a worker gets back from [Consumer.Fetch], with its body
// byte-exact.
type Job struct {
	// ID is the job id; Publish assigns one when it is empty (see [JobID]).
	ID string `json:"id"`
	// Queue is the name of the queue the job belongs to.
	Queue string `json:"queue"`
	// Method is the original request method of a deferred request, or "" for a direct job
	// (the worker uses the queue's target).
	Method string `json:"method,omitempty"`
	// Path is the original path with its raw query, e.g. "/api/orders?x=1", of a deferred
	// request; "" for a direct job.
	Path string `json:"path,omitempty"`
	// Direct is true for a job submitted through POST /v1/queues/{q}/jobs: deliver it to the
	// queue's target.
	Direct bool `json:"direct,omitempty"`
	// Header holds the request headers worth replaying; the caller filters hop-by-hop headers.
	Header http.Header `json:"header,omitempty"`
	// Body is the request body, stored and returned byte-exact. It is not part of the JSON
	// form: it travels as the raw message payload.
	Body []byte `json:"-"`
	// CreatedAt is when the job was accepted; Publish sets it when zero.
	CreatedAt time.Time `json:"created_at"`
	// IdempotencyKey is the client's Idempotency-Key, or "".
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// AckBy is when the publisher stops waiting for JetStream's acknowledgement and tells its
	// client that nothing was stored (the ingress's 503); zero when unknown. A job whose
	// message was stored so late that its acknowledgement may have come after AckBy is
	// checked by the worker before delivery (see Publisher.Publish).
	AckBy time.Time `json:"ack_by,omitzero"`
	// Tenant names who the job belongs to, as an opaque value the caller derives (the ingress:
	// [IDs.TenantID] of the queue's tenant key parts); "" is the one tenant of a queue without
	// tenants. It scopes the Idempotency-Key and the job's status.
	Tenant string `json:"tenant,omitempty"`
	// Cost is what the job costs in its queue's units (the queue's cost, read when the job was
	// accepted); 0 means 1, the cost of a job of a queue without cost_rate.
	Cost int64 `json:"cost,omitempty"`
	// Costs are what the job costs on each of its queue's budgets (config.Queue.Budgets), in
	// their order, read when the job was accepted; nil for a queue without budgets, and for
	// the jobs stored before the field existed. A job with fewer costs than its queue has
	// budgets (the config changed since) is charged 1 on the others.
	Costs []int64 `json:"costs,omitempty"`
	// NotBefore, when set, is the earliest time the job may be delivered: Publish stores a job
	// whose NotBefore is still ahead as scheduled (see [Publisher.Publish]), and a worker never
	// delivers it sooner on its own clock. Zero: as soon as the queue allows.
	NotBefore time.Time `json:"not_before,omitzero"`
	// Priority orders the job among the waiting jobs of its queue (of a fair queue: among its
	// tenant's waiting jobs, within the tenant's share); "" is normal.
	Priority Priority `json:"priority,omitempty"`
	// Budget, when set, is the deferral budget the job also takes a ticket of (ledger.go): a
	// rule's bound on how many of one key's jobs may wait. Publish reads it; it is not stored.
	Budget *Budget `json:"-"`
	// tickets are the job's admission tickets (ledger.go), carried in the Sluice-Tickets
	// header of its message from stream to stream and released when it leaves the queue.
	tickets []ticket
	// Trace is the W3C trace context of the span that enqueued the job (internal/tracing), so
	// that each delivery continues its trace; nil when it was enqueued without tracing, as are
	// the jobs stored before the field existed. A pointer: a Job without one stays as large
	// as before (BENCHMARKS.md, "tracing").
	Trace *TraceContext `json:"trace,omitempty"`
}

// TraceContext is a W3C trace context, as the traceparent and tracestate headers carry it.
type TraceContext struct {
	Traceparent string `json:"traceparent"`
	Tracestate  string `json:"tracestate,omitempty"`
}

// State is the lifecycle state of a job, as reported by GET /v1/jobs/{id}.
type State string

// The job states.
const (
	StateScheduled State = "scheduled" // accepted, waiting for its not-before time (Job.NotBefore)
	StateQueued    State = "queued"    // accepted, waiting for a worker
	StateRunning   State = "running"   // a worker is delivering it
	StateRetrying  State = "retrying"  // an attempt failed; it will be tried again
	StateSucceeded State = "succeeded" // the upstream answered 2xx
	StateFailed    State = "failed"    // permanently failed; it is in the dead-letter queue
	StateCanceled  State = "canceled"  // withdrawn before delivery; it is never delivered
)

// Terminal reports whether s is a final state (succeeded, failed or canceled).
func (s State) Terminal() bool {
	return s == StateSucceeded || s == StateFailed || s == StateCanceled
}

// Status is the recorded state of one job. Its JSON form is the body of GET /v1/jobs/{id}.
type Status struct {
	ID        string    `json:"id"`
	Queue     string    `json:"queue"`
	State     State     `json:"state"`
	Attempts  int       `json:"attempts"` // delivery attempts spent so far
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	LastError string    `json:"last_error"`
	// Response is the upstream's answer to the last attempt, or nil when there was none.
	Response *Response `json:"response"`
	// DeadLetter is true while the job sits in its queue's dead-letter stream.
	DeadLetter bool `json:"dead_letter,omitempty"`
	// NextAttemptAt is when a retrying job will be tried again, when known.
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	// NotBefore is the job's Job.NotBefore, for a job that was scheduled; nil otherwise.
	NotBefore *time.Time `json:"not_before,omitempty"`
	// Tenant is the job's Job.Tenant. It is not part of the JSON form: a caller that serves
	// the status compares it with the asker's tenant.
	Tenant string `json:"-"`
	// Delivered is the JetStream delivery count of the delivery that wrote this status (0:
	// none), so that a later delivery can tell how many deliveries in between left no record
	// (a worker that crashed, an ack that was lost). Not part of the JSON form.
	Delivered uint64 `json:"-"`
	// Held is how many deliveries of the job were held back unsent while its tenant was paused
	// (pause_scope: tenant); they spend neither an attempt nor a pause retry. JSON leaves it
	// out, as Delivered.
	Held int `json:"-"`
	// Seq is the job's sequence in its queue's delivery stream when Status found it waiting
	// there, else 0; BacklogSeq its sequence in its tenant's backlog when it was stored in one
	// (a fair queue; it may have been moved on since). For Publisher.Place; not part of the JSON
	// form.
	Seq        uint64 `json:"-"`
	BacklogSeq uint64 `json:"-"`
	// Priority is, with BacklogSeq, the job's priority: which of its tenant's backlog subjects
	// it waits on. Not part of the JSON form.
	Priority Priority `json:"-"`
}

// Response is what the upstream answered to a delivery attempt.
type Response struct {
	Status int `json:"status"`
}

// Spec describes one queue: its stream limits and its shared consumer. The zero value of each
// field means its default. The caller maps the config file's queue section to a Spec.
type Spec struct {
	// Name is the queue name: letters, digits, '-' and '_'.
	Name string
	// MaxDepth is the most jobs the queue holds (waiting and in flight); beyond it Publish
	// returns ErrFull. 0 means unlimited.
	MaxDepth int64
	// MaxBytes is the most bytes each of the queue's streams holds (its delivery stream,
	// priority levels, backlog, and — checked before each scheduled publish — its schedule
	// stream); 0 means unlimited.
	MaxBytes int64
	// TenantMaxDepth is the most jobs one tenant (Job.Tenant) holds in the queue, waiting,
	// scheduled and in flight, held exactly by the admission ledger (ledger.go); 0: no bound
	// but MaxDepth.
	TenantMaxDepth int64
	// MaxBodyBytes is the largest job body Publish accepts; 0 means no limit of its own (the
	// NATS server's max_payload still applies, and a body beyond it is ErrTooLarge too).
	MaxBodyBytes int64
	// DedupeWindow is how long an Idempotency-Key keeps returning the same job; default 24h.
	DedupeWindow time.Duration
	// StreamDuplicates is JetStream's own Nats-Msg-Id duplicate window, which covers
	// concurrent and crash-interrupted publishes of one id; default 2m.
	StreamDuplicates time.Duration
	// Replicas is the stream's replica count; default 1.
	Replicas int
	// AckWait is how long a worker may hold a job without acking or sending InProgress before
	// JetStream redelivers it; default 30s.
	AckWait time.Duration
	// MaxAckPending bounds the jobs held by all workers of the queue at once; default 1000.
	MaxAckPending int
	// Fair makes the queue share its deliveries among its tenants (Job.Tenant): jobs wait in
	// a backlog per tenant (see [FairLayout]), and a scheduler (package queue/fair) moves them
	// to the delivery stream in weighted round robin.
	Fair bool
	// Priorities gives a plain queue a stream and a consumer per priority level beside its
	// own, for jobs of priority high and low (see [Priority]); without it such jobs are
	// refused (ErrNoPriorities). Each level costs the NATS servers a stream and a consumer.
	Priorities bool
}

// Receipt is the result of a successful Publish.
type Receipt struct {
	// ID is the job id.
	ID string
	// Replayed is true when the job already existed (the same Idempotency-Key within the
	// dedupe window) and nothing new was enqueued.
	Replayed bool
	// Seq is where the new job was stored: its sequence in the queue's delivery stream, or in
	// a fair queue the backlog stream's; 0 when Replayed.
	Seq uint64
}

// Info is a snapshot of one queue, for the admin API and metrics.
type Info struct {
	Name string `json:"name"`
	// Depth is the number of jobs in the queue, waiting and in flight. In a fair queue it is
	// the backlogs' and the delivery stream's, read one after the other: a job the scheduler
	// moves in between is counted twice.
	Depth uint64 `json:"depth"`
	// Bytes is the size of the queue's stream in bytes.
	Bytes uint64 `json:"bytes"`
	// Pending is the number of jobs not yet handed to any worker.
	Pending uint64 `json:"pending"`
	// InFlight is the number of jobs handed to a worker and not yet acknowledged.
	InFlight int `json:"in_flight"`
	// Redelivered is the number of in-flight jobs that were delivered more than once.
	Redelivered int `json:"redelivered"`
	// Waiting is the number of pull requests (idle worker fetches) waiting for jobs.
	Waiting int `json:"waiting"`
	// Consumers is the number of consumers on the queue's stream (normally 1, shared).
	Consumers int `json:"consumers"`
	// DeadLetters is the number of jobs in the queue's dead-letter stream.
	DeadLetters uint64 `json:"dead_letters"`
	// MaxDepth is the configured depth limit (0 = unlimited).
	MaxDepth int64 `json:"max_depth"`
	// Left is how many jobs have left the queue since its stream was created: delivered,
	// dead-lettered or canceled. Its rate of change is the queue's drain rate.
	Left uint64 `json:"left"`
	// Scheduled is the number of jobs waiting for their not-before time (Job.NotBefore), and
	// of those whose time came that are not yet in the queue's stream; Depth does not count
	// them.
	Scheduled uint64 `json:"scheduled"`
	// Fair is whether the queue is fair (Spec.Fair). The fields below are set only then.
	Fair bool `json:"fair,omitempty"`
	// Backlog is how many of Depth wait in the tenants' backlogs, not yet scheduled.
	Backlog uint64 `json:"backlog,omitempty"`
	// Tenants is how many tenants have jobs in their backlogs.
	Tenants int `json:"tenants,omitempty"`
	// TopTenants are the TopTenants tenants with the deepest backlogs, deepest first.
	TopTenants []TenantDepth `json:"top_tenants,omitempty"`
}

// DeadLetter is one job in a queue's dead-letter stream.
type DeadLetter struct {
	Job        *Job      `json:"job"`
	Reason     string    `json:"reason"`
	LastStatus int       `json:"last_status,omitempty"` // the upstream's last status, 0 if none
	Attempts   int       `json:"attempts"`
	FailedAt   time.Time `json:"failed_at"`
	Seq        uint64    `json:"seq"` // sequence in the dead-letter stream
}

// Sentinel errors. Functions wrap them; test with errors.Is.
var (
	// ErrFull means the queue is at MaxDepth (or MaxBytes) and refused the job.
	ErrFull = errors.New("queue: full")
	// ErrTenantFull means the job's tenant holds Spec.TenantMaxDepth jobs in the queue.
	ErrTenantFull = errors.New("queue: tenant full")
	// ErrBudgetFull means the job's deferral budget (Job.Budget) has Budget.PerKey jobs of
	// its key waiting.
	ErrBudgetFull = errors.New("queue: deferral budget of the key spent")
	// ErrUnknownQueue means no queue of that name has been provisioned.
	ErrUnknownQueue = errors.New("queue: unknown queue")
	// ErrConsumerGone is Consumer.Fetch's error when the consumer no longer answers: deleted
	// (a shared queue's after SharedInactive, a former stream's once retired) or its stream
	// gone. Get the consumer again (Deliveries.Consumer).
	ErrConsumerGone = errors.New("queue: consumer gone")
	// ErrNotFound means there is no job (or dead letter) with that id.
	ErrNotFound = errors.New("queue: job not found")
	// ErrTooLarge means the job's body is larger than the queue (or the server) accepts.
	ErrTooLarge = errors.New("queue: body too large")
	// ErrNoPriorities is returned by Publish for a job of priority high or low to a plain
	// queue without Spec.Priorities.
	ErrNoPriorities = errors.New("queue: queue takes no priorities")
	// ErrIdempotencyMismatch means an Idempotency-Key was reused, within its dedupe window, for a
	// different request (method, path or body). The ingress answers 422.
	ErrIdempotencyMismatch = errors.New("queue: idempotency key reused for a different request")
	// ErrNoSchedule is returned by MoveDue for a queue without a schedule stream and mover:
	// none was made yet (the queue's first scheduled publish makes them), or they are being made.
	ErrNoSchedule = errors.New("queue: no schedule stream")
	// ErrNoCluster is returned by New and Provision when Replicas > 1 is asked of a NATS
	// server that runs JetStream without a cluster (JetStream's err 10074): permanent until the
	// replicas or the servers change, so not worth retrying.
	ErrNoCluster = errors.New("queue: replicas > 1 need a JetStream cluster")
	// ErrNoStore is returned by Provision when the NATS server cannot reserve a stream's
	// MaxBytes on its store (JetStream's err 10047: the streams' MaxBytes together exceed its
	// max_file_store). It lasts until a reservation is released or the store grows.
	ErrNoStore = errors.New("queue: the NATS server's store cannot reserve the stream's max bytes")
)
