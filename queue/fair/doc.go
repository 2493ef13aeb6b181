// Package fair schedules the fair queues of package queue: it shares a queue's deliveries
// among its tenants in proportion to their weights, however deep one tenant's backlog is.
//
// # Model
//
// Publish stores a fair queue's job in its tenant's backlog, one subject per tenant of the
// backlog stream (queue.FairLayout names them). A [Scheduler] moves jobs from the backlogs to
// the delivery stream, where workers take them through the queue's one consumer exactly as from
// a FIFO queue, so acks, retries, pauses, dead letters, cancels and the leak rate work
// unchanged. It keeps only Options.Target jobs waiting there and picks the next ones by deficit
// round robin over the tenants with waiting jobs: a tenant's turn adds its weight to its
// deficit, and it gives a job per whole unit. Within a tenant's share its high jobs
// (queue.PriorityHigh, a subject of their own beside the tenant's) go before its normal before
// its low, but that while a lower level waits at least one of every 8 of the tenant's jobs from
// it and above is of it. Options.TenantRate spaces one tenant's moves 1/TenantRate apart. A
// tenant with 10 jobs behind another's 300 waits for about Target jobs and the jobs the
// workers hold, not for the 300. The jobs waiting in the delivery stream are what its consumer
// counts pending or, when more, those the scheduler moved in the last 100ms that the consumer
// has not delivered yet (the server counts a stored job a moment after acknowledging it).
//
// # Guarantees
//
// Fairness changes which job comes next, never how many go out: the rate is the workers' and
// the leak schedule's. Any number of processes run a Scheduler for a queue; a lease (the meta
// bucket's entry fair.<queue>, renewed every 500ms, taken over when it has not moved for 2s on
// the taker's clock, by compare-and-set) lets one of them work. A job leaves its backlog only
// after the delivery stream acknowledged its copy, which carries the job's message id: a
// scheduler that dies in between leaves the job in both, and the next leader's copy is dropped
// as a duplicate within Spec.StreamDuplicates. So a crash of any process loses no job, and
// moves none twice if the takeover comes within StreamDuplicates; a scheduler that is stopped
// finishes the moves it started. Two schedulers that both believe they lead (one stopped past
// its lease and resumed) only move jobs in another order. When the leader dies, deliveries go
// on from what the delivery stream holds, and stop until another takes over, at most 2s later.
//
// # Costs
//
// On top of a FIFO queue, each job is stored twice (backlog, then delivery stream) and has a
// status entry. A tenant's share of a round is read with one batched direct get and removed
// with one purge (one job: one get, one delete), so many tenants of one job each cost the most.
// Every 500ms the leader reads the backlog's per-subject counts, one entry per tenant with
// waiting jobs. Per tenant: a subject while it has waiting jobs, ~100 bytes of the leader's
// state, and a delivered count in the tenants bucket that expires 24h after its last change;
// no consumer and no Redis key. docs/design/fair.md has the design, its rejected alternatives
// and the figures.
package fair
