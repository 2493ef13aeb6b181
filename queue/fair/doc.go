// Package fair schedules the fair queues of package queue: it shares a queue's deliveries
// among its tenants in proportion to their weights, however deep one tenant's backlog is.
//
// # Model
//
// Publish stores a fair queue's job in its tenant's backlog, one subject per tenant of the
// backlog stream (queue.FairLayout names them). A [Scheduler] moves jobs from the backlogs to
// the delivery stream, where workers take them through the queue's one consumer exactly as from
// a FIFO queue, so acks, retries, pauses, dead letters, cancels and the leak rate work
// unchanged. It keeps only a lookahead waiting there, Options.Target jobs and TargetUnits
// units (the worker: 250ms of the queue's rate and cost_rate), and picks the next jobs by
// deficit round robin over the tenants with waiting jobs: a tenant's visit adds its weight to
// its deficit, and it gives a job per whole unit. With Options.ByUnits a visit adds its weight
// times the quantum (the largest job cost known) and a job takes its cost: its Job.Cost, read
// only as it is moved, so the pick estimates it at the tenant's last job's cost and the
// deficit takes the job's cost once read; and the workers report what each job really cost,
// from its answer (ReportCost, costs.go), which the deficit takes too. Within a tenant's share its high jobs
// (queue.PriorityHigh) go before its normal before its low, but that while a lower level waits
// at least one of every 8 of the tenant's jobs from it and above is of it.
//
// # Guarantees
//
// Fairness changes which job comes next, never how many go out: the rate is the workers' and
// the leak schedule's. While tenants i and j both have waiting jobs and no cap holds either,
// the jobs (by units: the units) moved of each, over its weight, differ by at most about three
// quanta (by jobs a quantum is one job), plus by units the error of one pick's estimates of a
// tenant whose costs vary, which its next visits pay back. Caps hold in both modes:
// Options.TenantRate and TenantRates space a tenant's moves 1/rate apart (GCRA, burst 1) and a
// held tenant moves nothing, without saving up visits. Starvation is bounded: a tenant with
// waiting jobs and no cap holding it moves a job within one round of the others (weight w < 1:
// 1/w rounds; by units, one that owes pays within owed/(w × quantum) visits), and a round moves
// at most ⌈w⌉ jobs of a tenant of weight w (by units: w × quantum units and one job more). A
// newly arrived tenant, seen within 500ms (the backlogs' counts are reread that often), waits
// behind the lookahead (at most Target jobs, and TargetUnits units plus one job's cost) and the
// jobs workers hold, not behind others' backlogs.
//
// Any number of processes run a Scheduler for a queue; a lease (the meta bucket's entry
// fair.<queue>, renewed every 500ms, taken over when it has not moved for 2s, by
// compare-and-set) lets one of them work. A job leaves its backlog only after the delivery
// stream acknowledged its copy, which carries the job's message id: a crash of any process loses
// no job, and moves none twice if the takeover comes within Spec.StreamDuplicates.
//
// # Costs
//
// On top of a FIFO queue, each job is stored twice (backlog, then delivery stream) and has a
// status entry. A tenant's share of a round is read with one batched direct get, the one-job
// shares of up to 256 tenants with one request; a moved job leaves its backlog by the
// acknowledgement of the backlog's hold consumer (release.go: ~6 µs of nats-server's CPU, where
// a JetStream API request such as a delete costs ~30), all of a round's sent at once, and the
// hold delivers each job's headers once to a process that drops them. A backlog without a hold
// (made before it) removes a job by a delete and a larger share by one purge. By
// units, each job moved has its envelope (not its body) decoded for its cost. Every 500ms the
// leader reads the backlog's per-subject counts, one entry per tenant with waiting jobs, or,
// when no job arrived since the last such reading (up to 5s old), the stream's state alone. Per tenant: a subject while it has
// waiting jobs, ~100 bytes of the leader's state, and a delivered count in the tenants bucket
// that expires 24h after its last change; no consumer and no Redis key (the hold is one
// consumer per queue, with a pending entry per waiting job). docs/design/fair.md has
// the design and its rejected alternatives, docs/fairness.md the user's view, BENCHMARKS.md the
// figures.
package fair
