// Package queue is Sluice's JetStream layer: the job envelope, publishing with idempotency and
// backpressure, stream and consumer provisioning, consumption by workers, dead letters, and job
// status. It talks to NATS only through the nats.go jetstream package, and knows nothing of HTTP
// servers, Redis or the config file: the caller maps its configuration to [Spec] and [Options].
//
// # Layout
//
// With the default prefix "SLUICE", a queue named orders is:
//
//	stream   SLUICE_Q_orders      subjects SLUICE.q.orders.<job id>   work queue, file storage
//	consumer workers              durable pull consumer on SLUICE_Q_orders, shared by all workers
//	stream   SLUICE_DLQ_orders    subjects SLUICE.dlq.orders.<job id>   dead letters, limits retention
//	bucket   SLUICE_STATUS        key <job id> → the job's Status (one bucket for all queues)
//
// One stream per queue, not one stream with a subject per queue: JetStream enforces MaxMsgs,
// MaxBytes and DiscardNew per stream, so only a stream of its own gives each queue its own
// max_depth, refused with [ErrFull] at the moment of publishing, without one busy queue filling
// the space of another. Each queue also gets an independent consumer (its own ack floor,
// MaxAckPending and redelivery timers) and its depth is simply the stream's message count.
// A work-queue stream admits only one consumer per subject anyway. The dead-letter streams are
// per queue for the same reasons: their counts are stream counts, and one queue's failures
// cannot evict another's. Each dead letter has a subject of its own, keyed by job id, with
// MaxMsgsPerSubject 1, so a dead letter is found by id in one request and a job dead-lettered
// twice (a crash between the dead-letter publish and the ack) is stored once.
//
// Each job has a subject of its own so that [Queues.Status] can read a waiting job by id (see
// Status below); the stream also keeps the bare subject <prefix>.q.<queue>. The cost: the
// server tracks every subject of a stream, a few hundred bytes of memory per waiting job, freed
// as jobs are acked, and a little more CPU per publish; consuming costs the same (the figures
// are in BENCHMARKS.md, "queue").
//
// Streams use WorkQueue retention (a job leaves the stream when a worker acks it), DiscardNew at
// MaxDepth, file storage and Spec.Replicas. The consumer acks explicitly, redelivers after
// Spec.AckWait, and never gives up by itself (MaxDeliver -1): workers count attempts, decide about
// retries and dead-letter the job themselves, so that 429/503 pauses do not spend attempts.
// Lowering MaxDepth on a reload below the current depth keeps every job already accepted (the
// server does not trim DiscardNew streams) and refuses new ones until the queue drains.
//
// # Publishing and idempotency
//
// [Queues.Publish] returns only after the stream's PubAck: a nil error means the job is stored
// (on Spec.Replicas servers, fsync policy of the server permitting). The message id (Nats-Msg-Id)
// is the job id, so JetStream drops a second copy of the same id within Spec.StreamDuplicates.
// Each call publishes asynchronously and waits on its own PubAck future: concurrent callers
// share the connection's one ack subscription and never wait on each other's round trips.
//
// The job travels as one message: its body byte-exact as the payload, everything else as JSON
// in the Sluice-Job header (header values that are not valid UTF-8 are base64-encoded there).
// The JSON is written by hand, the same document encoding/json makes of it (a test holds the
// two byte for byte), and read back with encoding/json.
//
// A job without an Idempotency-Key is that one message and nothing else: one JetStream round
// trip and one stored message per job. Its id, a UUID version 7 from [NewJobID], ends with 16
// bits that tag its queue, so Status, given only the id, knows which queue's stream to ask for
// the message on subject <prefix>.q.<queue>.<id>, and reports the job queued while it waits
// there. The job's status entry is written by the first worker that records progress
// (running, or the outcome of a first attempt), and workers record before they ack. One message
// per job, rather than the job and then a status entry, halves the server's work per publish.
//
// A job with an Idempotency-Key gets the id [Queues.JobID](queue, tenant, key): an HMAC under
// the deployment's secret (Options.IDSecret, or the one kept in the <prefix>_META bucket), so
// that two tenants' keys never meet and an id cannot be computed from a key. It carries no
// queue tag. The record that the key was used is the job's status entry in the status bucket,
// which lives at least Spec.DedupeWindow (JetStream's own duplicate window is only minutes).
// Publish
//
//  1. reads the status entry: if it exists, the job exists; return its id with Replayed (a
//     retracted entry, see below, does not count: the key makes a new job);
//  2. publishes with Nats-Msg-Id = job id; a PubAck marked Duplicate means another publish of the
//     same id won (a concurrent request, or an earlier one that crashed before step 3): Replayed;
//  3. creates the status entry (queued) if none exists yet.
//
// Steps 2 and 3 are not done at once: a crash between the entry landing and the job being
// stored would leave an entry that makes every retry of the key a Replayed 202 for a job that
// does not exist. A job whose id the caller chose, without the queue's tag, also gets its entry
// in step 3.
//
// A publish that fails answers "not stored", and Publish makes that true. While the connection
// is down, a publish fails before anything is sent (the processes' connections have no
// reconnect buffer). Where the outcome is unknown — the PubAck did not come before the
// deadline, or the connection dropped with the publish on the wire — Publish withdraws the job
// in the background: when the message turns out to be stored, the job's status becomes canceled
// (retracted) and then its message is deleted, retrying until JetStream answers (until Close).
// Every job carries Job.AckBy, the instant its publisher stopped waiting; a worker that takes a
// job stored within a second of it waits for the withdrawal and drops a withdrawn job. AckBy is
// on the publisher's clock and the storage time on the NATS server's: a server clock more than
// about a second ahead of the publisher's makes every job look stored late, which costs each
// first delivery a wait until AckBy plus a second and a status read — latency, never a loss.
//
// Crash reasoning. A crash or error before the PubAck leaves no status entry, so it claims
// nothing; the client sees an error and may retry. A crash between steps 2 and 3 leaves a stored
// job without a status entry: a retry within StreamDuplicates is deduplicated by JetStream and
// writes the missing entry; the first worker to take the job also writes it. Only a retry that
// comes after StreamDuplicates and before any worker took the job can enqueue the job a second
// time — with the same job id, which workers send upstream as Idempotency-Key. Concurrent first
// requests with one key race only at step 2, where JetStream lets one through.
//
// A repeat with the same key but a different request (method, path or body) is refused with
// [ErrIdempotencyMismatch], as Stripe and the IETF Idempotency-Key draft do (422).
//
// # Backpressure
//
// A stream at MaxMsgs or MaxBytes refuses the publish (JetStream API error 10077, "maximum
// messages exceeded" / "maximum bytes exceeded"); Publish returns [ErrFull], as it does when the
// server or account is out of storage (10047, 10028, 10002). Every Publish that returned nil is in
// the stream; the tests count them, including for the DiscardNew + MaxMsgs + MaxBytes combination
// that once lost messages silently (nats-server #4771) and across a server crash.
//
// # Status
//
// [Queues.Status] reads the job's status entry; without one, the job's message in its queue
// (queued); without that, the entry once more, because a worker may have taken, recorded and
// acked the job between the first two reads. So a job is found from the moment Publish
// returns: queued while it waits (however long: a waiting job's status does not expire), then
// what its workers record. An unknown id costs up to three reads. A job that left its queue with
// nothing recorded (every status write of its worker failed) is reported unknown, not queued.
//
// The status bucket keeps one entry per job, expiring max(Options.StatusTTL, every
// Spec.DedupeWindow) after its last update. Workers update it with [Queues.SetStatus]; a status
// that says succeeded is never moved back by a late, stale update.
//
// # Fair share among tenants
//
// A queue with Spec.Fair gives each tenant (Job.Tenant) with waiting jobs a share of its
// deliveries in proportion to its weight, however deep another tenant's backlog is. The model:
//
//	stream   SLUICE_T_orders      subjects SLUICE.t.orders.<tenant>   the tenants' backlogs
//	stream   SLUICE_Q_orders      as above                            the delivery stream
//	bucket   SLUICE_TENANTS       key <queue>.<tenant> → jobs delivered
//	entry    SLUICE_META fair.<queue>                                 the scheduler's lease
//
// Publish stores a fair queue's job in its tenant's backlog, one subject per tenant, and writes
// its status entry (queued, with the job's place in the backlog, so that Status and Cancel find
// it). A scheduler, [Fair], moves jobs from the backlogs to the delivery stream, where workers
// take them through the queue's one consumer exactly as from a FIFO queue, so acks, retries,
// pauses, dead letters, cancels and the global leak rate work unchanged. The scheduler keeps
// only FairOptions.Target jobs waiting in the delivery stream (the worker sets a fifth of a
// second of the queue's rate) and picks the next ones by deficit round robin over the tenants
// with waiting jobs: a tenant's turn adds its weight to its deficit and it gives a job per
// whole unit. A tenant with 10 jobs behind another's 300 therefore waits for about Target jobs
// and the jobs the workers hold, not for the 300. FairOptions.TenantRate caps each tenant by
// spacing its moves 1/TenantRate apart (the scheduler sleeps until the next one is due), so a
// capped tenant gets just under its cap.
//
// Guarantees. The deliveries' order and rate are still set by the workers and the leak
// schedule: fairness changes which job comes next, never how many go out. Any number of
// processes run a scheduler for the same queue; a lease in the meta bucket, renewed every
// 500ms and taken over when it has not moved for 2s (by compare-and-set, no clocks compared),
// lets one of them work. A job is deleted from its backlog only after the delivery stream
// acknowledged its copy, which carries the job's message id: a scheduler that dies between the
// two leaves the job in both, and the next leader's copy is dropped by the delivery stream's
// duplicate window (a scheduler that is stopped finishes the moves it started first). So a crash or a SIGKILL of any process loses nothing, and a job is moved
// once as long as the takeover comes within Spec.StreamDuplicates. Two schedulers that both
// believe they lead (one stopped past its lease and resumed) only move jobs in a different
// order. When the leader dies, deliveries go on from what the delivery stream holds and stop
// until another takes over, at most 2s later.
//
// Costs. On top of the FIFO path, each job is published twice (to its backlog, then to the
// delivery stream), and Publish writes the status entry a job without an Idempotency-Key does
// not otherwise need. The scheduler reads a tenant's share of a round with one batched direct
// get and removes it with one purge (a single job: one get and one delete), so many tenants of
// one job each cost the most (BENCHMARKS.md, "Fair queues": 0.57× the FIFO drain with 10 000
// tenants, 0.81× with one). Per tenant: a subject in the
// backlog stream while it has waiting jobs (the server keeps a few hundred bytes for it), the
// scheduler's ~100 bytes of round-robin state, and a delivered count in the tenants bucket,
// which expires 24h after its last change. Every 500ms the leader reads the backlogs' subject
// counts, one entry per tenant with waiting jobs: with 10 000 such tenants, a few hundred
// kilobytes. A tenant that goes idle costs nothing once its backlog is empty: its subject
// disappears, the leader drops it at the next read, and its count expires. There is no
// consumer and no Redis key per tenant.
//
// Rejected: a consumer per tenant (10 000 consumers cost the server far more than 10 000
// subjects, and workers would need to poll them all); one consumer with a filter rewritten per
// delivery (a consumer update per job); reordering by handing jobs back with a delay (a deep
// backlog is read through job by job); and picking the tenant in Redis with each leak slot
// (Redis would have to mirror which tenants have jobs, and a queue could not be fair without
// Redis). Leaving the jobs in the delivery stream and reading ahead to find other tenants' jobs
// was rejected too: it is fair only within how far a worker reads ahead.
package queue
