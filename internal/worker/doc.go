// Package worker drains Sluice's queues: a [Pool] pulls jobs from each queue's shared
// JetStream consumer, admits each (its leak slot and whatever else its queue asks), delivers
// it to the upstream, and acks, retries or dead-letters it by the upstream's answer.
//
// Model. Run one Pool per process, in as many processes and on as many hosts as you like;
// they share each queue's consumer (a job goes to one of them at a time), its leak schedule
// (leaky.Schedule, in Redis across processes) and its concurrency places (inflight). A job in
// hand goes through recall (its status, on a redelivery), admission, send (one HTTP attempt,
// bounded by QueueConfig.Timeout), and settle, a pure function from how that ended to a plan —
// record a status; ack, nak after a delay, hand back or dead-letter; pause — which an executor
// carries out. Admission and what learns from answers are policies, one per feature (leak
// slot, places, unit budget, tenant and operator pauses, learners, the scheduled-job mover,
// the fair scheduler): each may admit (go, hold until a time, refuse), observe an answer, and
// run beside the queue (docs/design/worker.md). The Pool reaches NATS through its own
// [Broker] interface, which *queue.Queues satisfies.
//
// Guarantees.
//   - The queue's aggregate delivery rate never exceeds its rate plus its burst, however many
//     workers drain it; a worker whose slot came too late gives it up rather than bunching
//     deliveries at the upstream. Deliveries in flight never exceed max_in_flight.
//   - 2xx acks the job; 429 or 503 pauses the queue (or the tenant, with pause_scope: tenant)
//     for the answer's Retry-After (or DefaultPause) and retries without spending an attempt,
//     at most MaxPauseRetries times; other 5xx, 408, 425, timeouts and connection errors retry
//     with Backoff until MaxAttempts; other 4xx, redirects and unroutable jobs are
//     dead-lettered at once.
//   - Attempts are counted in the job's status record, so a crash never hides a delivery the
//     upstream may have seen: Sluice-Attempt never repeats a number, and a job that kills its
//     workers is dead-lettered after MaxAttempts (+1) deliveries. A redelivered job whose
//     status is already final is acked, not delivered again. A record whose write failed
//     (NATS down) is kept in the worker's outbox and written when NATS answers again; nothing
//     is delivered while the connection is down, within a second of its return (the outboxes
//     land first), or when the record of a job that must be read cannot be (outbox.go).
//   - A worker cut off from Redis (its leak schedule and places) hands back every job waiting
//     for a slot or a place storeGiveUp (2s) after the first failed call began, and fetches none
//     until Redis answers a probe; each Redis call ends within a second (internal/connect), so
//     the bound holds against a black hole, not only a refused connection (docs/operating.md,
//     "Partitions").
//   - A scheduled job is never delivered before its due time on the worker's clock, nor once
//     canceled. While lower-priority jobs wait, at least one of every 8 jobs a runner takes is
//     of the lower level.
//   - A unit queue (cost_rate) delivers within its units too, each job charged its estimate
//     and, with CostFromResponse, reconciled to the answer's true cost; a streamed answer
//     (text/event-stream, JSON lines) is read to its end for its usage events and keeps none
//     of it (cost.Stream); one cut short leaves its estimate standing. A queue with budgets
//     (input and output tokens) takes one slot for its rate and every budget in one Redis
//     script, each budget charged the job's cost on it and reconciled with its own pointer
//     (budgets.go): no budget goes over its own rate, and the binding one sets the pace.
//   - Every delivery carries Sluice-Job, Sluice-Attempt and Idempotency-Key (the client's own
//     key scoped to the job's tenant, queue.UpstreamKey, or the job id). With Deps.Tracer set,
//     each admission run and each delivery is a span in the trace of the request that enqueued
//     the job (queue.Job.Trace), and the delivery carries its own span's traceparent
//     (trace.go, docs/tracing.md).
//   - A job's admission tickets are released after its acknowledgement (package queue); every
//     worker sweeps its queues' ledgers for tickets whose job left without (ledger.go).
//   - On shutdown the Pool stops fetching, hands back the jobs waiting for slots, lets
//     deliveries in flight finish within Deps.ShutdownTimeout, cuts the rest short and hands
//     them back; Run returns within ShutdownTimeout plus one second even when NATS cannot be
//     reached (the jobs it could not settle come back after their AckWait).
//
// Costs. A first delivery that ends within 100ms costs one slot take (one Redis script, shared
// with the overlapping takes of the queue's other jobs), one status write and an unconfirmed
// ack; a redelivery or a longer delivery writes its running status too, and a redelivery reads
// the job's record first — so do first deliveries within max(2×AckWait, 30s) of a start or a
// reconnect to NATS, one batched read per fetch; in that window after a reconnect a first
// delivery also claims its attempt (a compare-and-set write) before it is sent. A job frees its place among Concurrency once
// the upstream answered; a queue paced at 200/s or more writes its statuses at 10 ms ticks of
// the wall clock. A unit queue's job costs a unit take and, with CostFromResponse, a
// reconciliation; a capped queue's place costs two Redis scripts per second or so while the
// cap has room (inflight.Reuse), per delivery while it binds. Concurrency must cover rate ×
// (slot-to-ack time + the longest stall) across all workers for the rate to hold.
//
// Queues of shared streams (queue.Options.SharedStreams) have runners on demand (shared.go):
// none while idle, one started by the first job's doorbell or by the sweep that finds jobs no
// bell announced (at start and every 5 s), stopped after an idle long pull when its consumer
// holds nothing. Idle, such a queue costs a worker nothing; a job on it waits for the bell, a
// consumer lookup (or creation, on the queue's first job) and a fetch, and at most 5 s when its
// bell was lost. Every pool sweeps, shared queues or not: the sweep also finds the former
// streams of queues that moved (shared streams turned on, off or recounted), which their
// runners drain first, at the queue's one rate, and retire once empty (former.go); each costs
// one stream listing per 5 s.
//
// The reasoning behind each rule and the rejected designs are in docs/design/worker.md;
// figures are in BENCHMARKS.md.
package worker
