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
// Status below). The stream also keeps the bare subject SLUICE.q.orders, which versions before
// this one published every job to; Provision adds the per-job subjects to such a stream in
// place, and the jobs already in it are delivered as before. The server tracks each subject of
// a stream: about 330 bytes of memory per waiting job (measured with 500,000 jobs on
// nats-server 2.15: 317 MB against 147 MB on one shared subject), freed as jobs are acked, so a
// backlog of a million jobs takes about 330 MB more server memory than it would on one
// subject; and about 4 µs more server CPU per publish (17-24 against 13-20 µs in one prototype
// run). Consuming showed no difference beyond noise.
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
// trip and one stored message per job. Its id, a UUID version 7 from [JobID], ends with 16 bits
// that tag its queue, so Status, given only the id, knows which queue's stream to ask for the
// message on subject <prefix>.q.<queue>.<id>, and reports the job queued while it waits there.
// The job's status entry is written by the first worker that records progress (running, or
// the outcome of a first attempt), and workers record before they ack. Measured as CPU time
// per job of client and server together (16 concurrent publishers; it decides throughput when
// every core is busy, and is steadier than wall time on a shared machine), in six interleaved
// runs of BenchmarkPublish before and after, against the embedded server:
//
//	                                          CPU per job   per raw PublishAsync in the same run
//	the job, then the status entry (before)   58-69 µs      2.5-3.2×
//	the job only, on its own subject (now)    27-37 µs      1.0-1.8×
//
// A prototype against a separate nats-server process also tried writing the job and the
// status entry at once, awaited together: 50-70 µs per job, against 67-79 µs one after the
// other and 33-44 µs for the job alone. Concurrency overlaps the two round trips' latency, but
// the server still stores two messages and the client still handles two acks; it would also
// have needed a clean-up for an entry whose job failed to publish. One message per job halves
// the server's work. The envelope written by hand and the JetStream headers set directly (not
// through jetstream's per-call options) halved the client's allocations, 117 to 60 per publish
// with the embedded server's counted in.
//
// A job with an Idempotency-Key gets a deterministic id, [JobID](queue, key), which carries no
// queue tag. The record that the key was used is the job's status entry in the status bucket,
// which lives at least Spec.DedupeWindow (24h by default; JetStream's own duplicate window is
// only minutes). Publish
//
//  1. reads the status entry: if it exists, the job exists; return its id with Replayed;
//  2. publishes with Nats-Msg-Id = job id; a PubAck marked Duplicate means another publish of the
//     same id won (a concurrent request, or an earlier one that crashed before step 3): Replayed;
//  3. creates the status entry (queued) if none exists yet.
//
// Doing steps 2 and 3 at once would save one round trip of latency (measured: about 10% of
// the wall time and 5% of the CPU), but a crash between the entry landing and the job being
// stored would leave an entry that makes every retry of the key a Replayed 202 for a job that
// does not exist. A job whose
// id the caller chose, without the queue's tag, also gets its entry in step 3.
//
// Crash reasoning. A crash or error before the PubAck leaves no status entry, so it claims
// nothing; the client sees an error and may retry, and if the message was stored after all (a
// publish nats.go buffered while reconnecting is sent when the server is back), the retry is
// deduplicated by step 2 within StreamDuplicates, and Status reports an unkeyed job queued —
// which it is. A crash between steps 2 and 3 leaves a stored job without a status entry: a
// retry within StreamDuplicates is deduplicated by JetStream and writes the missing entry; the
// first worker to take the job also writes it. Only a retry that comes after StreamDuplicates
// and before any worker took the job can enqueue the job a second time — with the same job id,
// which workers send upstream as Idempotency-Key. Concurrent first requests with one key race
// only at step 2, where JetStream lets one through.
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
package queue
