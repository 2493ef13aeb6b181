package config

import "time"

// Queue is a queue of deferred work that workers drain at a fixed global rate.
type Queue struct {
	// Name is 1 to 64 of A-Z, a-z, 0-9, "_" and "-"; unique among queues. Required.
	Name string
	// Rate is the leak rate, shared by all workers together. Required.
	Rate Rate
	// Burst is how many deliveries may go out at once after an idle spell, on top of the
	// steady rate. Default 0: deliveries are strictly Rate.Interval() apart.
	Burst int64
	// MaxDepth is the most jobs the queue holds; beyond it new jobs are refused with 429
	// (YAML max_depth). Default 100000.
	MaxDepth int64
	// MaxBodyBytes bounds the body of a job, in bytes (YAML max_body_bytes). Default 1 MiB.
	MaxBodyBytes int64
	// MaxBytes bounds the bytes the queue's stream holds, JetStream's own MaxBytes (YAML
	// max_bytes), >= MaxBodyBytes; beyond it new jobs are refused with 429, as beyond
	// MaxDepth. The NATS server reserves it on its store when the stream is created. Default
	// 0: no bound of its own and nothing reserved (the server's store limit still refuses
	// writes once reached), or, with nats.store_budget, an equal share of the budget.
	MaxBytes int64
	// Target is where directly submitted jobs are delivered (YAML "POST http://host/path";
	// the method is optional and defaults to POST). Nil: the queue has no target of its own
	// and serves only the deferred requests of rules, which go to Config.Upstream.
	Target *Target
	// MaxAttempts is how many delivery attempts a job gets before it is dead-lettered (YAML
	// max_attempts), >= 1. Default 8.
	MaxAttempts int
	// Backoff spaces the retries of a failed delivery. Default {Initial: 1s, Max: 5m}.
	Backoff Backoff
	// Timeout bounds one delivery attempt. Default 10s.
	Timeout time.Duration
	// DedupeWindow is how long an Idempotency-Key maps to its job (YAML dedupe_window).
	// Default 24h.
	DedupeWindow time.Duration
	// AckWait is how long a job held by a worker that died waits before JetStream hands it to
	// another (YAML ack_wait), >= 100ms. Live workers keep the jobs they hold alive, so it can
	// be short; it is also how long the jobs a stopped embedded server held take to come back
	// after a restart of the quickstart. Default 30s.
	AckWait time.Duration
	// MaxDelay is how far ahead a job may be scheduled (Sluice-Delay, Sluice-Not-Before; YAML
	// max_delay); a job scheduled further ahead is refused with 400. Default 30 days (as
	// Cloud Tasks), at most 366 days.
	MaxDelay time.Duration
	// Priorities lets the queue's jobs carry Sluice-Priority high or low (YAML priorities):
	// a plain queue then keeps a stream and a consumer per level beside its own, which cost
	// the NATS servers; without it, such a submission is refused with 400. A fair queue
	// keeps a job's priority without levels.
	Priorities bool
	// PriorityClaims, when priorities is a mapping, says who may claim Sluice-Priority: high
	// (its high list: tenant:VALUE, header:NAME=VALUE, query:NAME=VALUE, rule:NAME) and what
	// others asking for it get (others: normal, the default, or refuse: 403). nil: priorities
	// is true or false, and anyone may ask for high (Warnings says so).
	PriorityClaims *PriorityClaims
	// Concurrency is how many deliveries of this queue one worker process has in flight.
	// Default 4.
	Concurrency int
	// MaxPauseRetries is how many times a job is retried after an upstream 429 or 503
	// without spending an attempt (YAML max_pause_retries), >= 0. Default 20.
	MaxPauseRetries int
	// Tenant are the key parts, as a rule's key, that name who a job belongs to (YAML
	// tenant): they scope its Idempotency-Key and who may read its status. Empty: the queue
	// has one tenant.
	Tenant []KeyPart
	// Global shares Rate, and CostRate and CostBurst by the same fraction, with the other
	// regions (YAML global): this region delivers at its lease's share of them. Needs Config.Region and Config.Regions. Default false.
	Global bool
	// Adaptive makes Rate the ceiling of a rate the workers learn from the upstream's
	// answers: lower on 429/503 and low remaining quota, back up while it answers 2xx (YAML
	// adaptive). Default false.
	Adaptive bool
	// MinRate is the floor of the learned rate (YAML min_rate). Default: Rate/100, at least
	// 1/s (or Rate itself when that is lower).
	MinRate Rate
	// Fair shares the queue's rate among the tenants that have jobs waiting, in weighted
	// round robin, instead of delivering in arrival order (YAML fair). Needs Tenant.
	Fair bool
	// FairBy is what a fair queue's round robin shares among its tenants (YAML fair_by): its
	// jobs (FairByJobs; "" as well, the default) or, on a queue with CostRate, their units
	// (FairByUnits).
	FairBy FairBy
	// Weights maps a tenant's value (its key parts' values, joined by NUL bytes when there
	// are several) to its weight in the round robin, > 0 and <= 1000; default 1.
	Weights map[string]float64
	// TenantRate caps the deliveries of any one tenant of a fair queue (YAML tenant_rate);
	// zero: no cap.
	TenantRate Rate
	// MaxInFlight caps the deliveries of the queue in flight at once across every worker
	// process (YAML max_in_flight): a delivery holds its place from the start of its request
	// until its answer or timeout. Zero: no cap but each worker's Concurrency.
	MaxInFlight int64
	// TenantInFlight caps the deliveries of any one tenant of a fair queue in flight at once
	// across every worker process (YAML tenant_in_flight). Zero: no cap.
	TenantInFlight int64
	// PauseScope is what an upstream 429 or 503 pauses (YAML pause_scope): PauseQueue (the
	// default) or PauseTenant, the job's tenant only, on a fair queue.
	PauseScope PauseScope
	// pauseScopeSet is whether the file set pause_scope (Warnings: a queue with tenants that
	// leaves it to the default pauses every tenant for one tenant's 429).
	pauseScopeSet bool
	// TenantMaxDepth is the most jobs one tenant may hold in the queue (YAML
	// tenant_max_depth), waiting, scheduled and in flight, 1 to max_depth; it needs tenant.
	// Beyond it that tenant's new jobs are refused with 429 while other tenants' are accepted;
	// the queue's admission ledger holds it exactly. 0: no bound but MaxDepth.
	TenantMaxDepth int64
	// TenantSettings are single tenants' own settings on a fair queue, by the tenant's value
	// as Weights names it (YAML tenant_settings); an operator's (the admin API's) replace them.
	TenantSettings map[string]TenantSettings
	// Cost is what one job costs in the queue's units (YAML cost), read when the job is
	// accepted; the default costs 1. It needs CostRate.
	Cost Cost
	// CostFallback is the cost of a job whose cost cannot be read (YAML cost_fallback);
	// 0: CostCapacity (see Fallback).
	CostFallback int64
	// CostRate is the units per period the queue delivers, shared by every worker, beside
	// Rate (YAML cost_rate): a job waits for both. Zero: no unit budget.
	CostRate Rate
	// CostBurst is how many units may go at once after idleness (YAML cost_burst); 0: a job's
	// units are spaced at CostRate from the previous job's.
	CostBurst int64
	// CostFromResponse reads a delivery's true cost from the upstream's answer (YAML
	// cost_from_response): the difference from Cost is charged or refunded to the queue's
	// unit schedule. Zero: the charged cost stands.
	CostFromResponse Cost
	// Budgets are the queue's unit budgets (YAML budgets), in place of its own CostRate: a
	// job waits for its units on every one, each charged and reconciled on its own.
	Budgets []QueueBudget
}

// TenantSettings are one tenant's own settings; a zero field keeps the queue's.
type TenantSettings struct {
	// Label is what admin reads show of the tenant beside its id (YAML label), such as
	// "acme": its value (an API key, often) is never shown. Up to 64 printable characters,
	// not the value itself. "": the id alone.
	Label string
	// Weight is its weight in the round robin, > 0 and <= 1000 (as Weights).
	Weight float64
	// Rate caps its deliveries, in place of tenant_rate.
	Rate Rate
	// InFlight caps its deliveries in flight, in place of tenant_in_flight.
	InFlight int64
}

// FairBy is what a fair queue shares among its tenants by weight.
type FairBy string

// The shares of a fair queue.
const (
	// FairByJobs counts jobs: each tenant gets deliveries in proportion to its weight,
	// whatever they cost.
	FairByJobs FairBy = "jobs"
	// FairByUnits counts units (cost_rate's): each tenant gets units in proportion to its
	// weight, each job counted at its cost as the queue read it when it was accepted.
	FairByUnits FairBy = "units"
)

// PauseScope is what an upstream's 429 or 503 (and its Retry-After) pauses.
type PauseScope string

// The pause scopes.
const (
	// PauseQueue pauses the whole queue, on every worker.
	PauseQueue PauseScope = "queue"
	// PauseTenant pauses the tenant of the job that was answered, on every worker; the other
	// tenants go on at the queue's rate. An operator's pause still pauses the whole queue.
	PauseTenant PauseScope = "tenant"
)

// TenantWeights returns Weights by tenant id: id (the queue layer's Queues.TenantID, keyed
// with the deployment's id secret) of each value. nil when Weights is empty; id is called only
// for Weights' values.
func (q *Queue) TenantWeights(id func(key []byte) string) map[string]float64 {
	if len(q.Weights) == 0 {
		return nil
	}
	out := make(map[string]float64, len(q.Weights))
	for v, w := range q.Weights {
		out[id([]byte(v))] = w
	}
	return out
}

// Target is the destination of a queue's directly submitted jobs.
type Target struct {
	// Method is an HTTP method, upper case. Default "POST".
	Method string
	// URL is an absolute http or https URL.
	URL string
}

// Backoff is an exponential backoff between delivery attempts.
type Backoff struct {
	// Initial is the delay before the first retry, > 0. Default 1s.
	Initial time.Duration
	// Max caps the delay, >= Initial. Default 5m.
	Max time.Duration
}

// Streams is how many JetStream streams queue q is made of, each with its MaxBytes: its own,
// a fair queue's tenants' backlog, a priority queue's high and low levels.
func (q *Queue) Streams() int64 {
	switch {
	case q.Fair:
		return 2
	case q.Priorities:
		return 3
	}
	return 1
}
