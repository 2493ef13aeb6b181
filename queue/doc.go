// Package queue is Sluice's JetStream layer: the job envelope, publishing with idempotency and
// backpressure, provisioning, consumption by workers, dead letters and job status. It uses only
// nats.go's jetstream package and knows nothing of HTTP, Redis or the config file: callers map
// their configuration to [Spec] and [Options].
//
// # Model
//
// [Queues] is one connection (and a second, for the admission holds' deliveries, once it
// opens a consumer: hold.go). It provisions the queues and reads their state, and hands out
// its roles, which it also embeds: [Publisher] (publish, job status), [Deliveries] (consumers,
// dead letters), [Operator] (controls, cancels), [Schedules] (due scheduled jobs) and [IDs]
// (the id scheme). A caller names the role it uses. With the default prefix SLUICE, queue
// orders is the work-queue stream SLUICE_Q_orders (one subject per job, SLUICE.q.orders.<id>),
// its durable pull consumer "workers" shared by every worker, and the dead-letter stream
// SLUICE_DLQ_orders, made by the queue's first dead letter. The bucket SLUICE_STATUS holds job
// statuses by id, SLUICE_META the id secret and the operators' controls. A job is one message:
// its body byte-exact as the payload, the rest as JSON in the Sluice-Job header. A fair queue
// (Spec.Fair) adds its tenants' backlogs ([FairLayout], scheduled by package queue/fair; a
// moved job leaves by the backlog's hold consumer's acknowledgement, as a ticket does); a
// high or low job (Job.Priority) waits in SLUICE_QH_orders or SLUICE_QL_orders; a job with a
// Job.NotBefore ahead waits as a message schedule in SLUICE_S_orders until MoveDue moves it.
// SLUICE_L_orders is the queue's admission ledger: one ticket per job it holds, in any of
// those streams (ledger.go), held by its "hold" consumer until the job's exit acknowledges it
// (hold.go).
//
// Queues is safe for concurrent use, by any number of processes on the same streams. It runs
// goroutines of three kinds: one following the connection's status, the withdrawals of failed
// publishes, and the moves MoveDue starts; [Queues.Close] ends them.
//
// # Guarantees
//
// Publish returns nil only after JetStream stored the job (its PubAck); a full queue is
// [ErrFull]. Every job takes a ticket in its queue's ledger first, so Spec.MaxDepth and
// Spec.TenantMaxDepth bound the jobs held in all of its streams together, scheduled ones
// included, exactly under any concurrency ([ErrTenantFull]); a Job.Budget bounds one key's
// jobs the same way ([ErrBudgetFull]). A publish answered as failed stays failed: a job stored after all is withdrawn in
// the background (recorded canceled, then deleted). A job with an Idempotency-Key gets the id
// [IDs.JobID] (an HMAC under the deployment's secret); a repeat within Spec.DedupeWindow
// returns the first job with Replayed, a repeat for another request [ErrIdempotencyMismatch];
// concurrent and crash-interrupted first publishes are settled by JetStream's duplicate window.
// [Publisher.Status] finds a job from the moment Publish returns. Workers ack explicitly and
// count attempts themselves (MaxDeliver -1): a job stays in its stream until a worker acks it
// (or dead-letters it, or it is canceled), and is delivered again after Spec.AckWait unacked.
// A job the server sent for a fetch that stopped waiting (a no-wait fetch answered after 1 s, a
// long pull's end) goes to the next Fetch of its consumer in the process as the same delivery,
// or is handed back after a quarter of AckWait (at most 5 s), never held for an AckWait (pull.go).
// Lowering MaxDepth never drops a job. A job that left its queue but whose message stayed in
// its stream after a fault (acked while the stream could not write, or recorded final by a
// worker that died before its ack) is a leftover: Info does not count the first kind, and
// [Deliveries.RemoveLeftovers] removes both (leftovers.go). A scheduled job reaches the queue at its time, not
// before, and once (a move repeated by a crash is dropped by its message id or its status).
//
// # Costs
//
// Every publish first stores a ticket (one round trip), and every job's exit deletes it (one
// request, in the background). A job without an Idempotency-Key is one message and one round
// trip beside its ticket: its id ([NewJobID])
// ends with a tag of its queue, so Status finds it in its stream by id, and no status entry is
// written until a worker records progress. A keyed job costs a status read, the message and a
// status entry; an unknown id costs Status up to three reads. The server keeps a few hundred
// bytes per waiting job for its subject. Provisioning a queue costs one stream and one
// consumer; its dead-letter and schedule streams cost nothing until first used. A scheduled
// job costs two stream reads, its schedule and a status entry, and when due a get, a publish
// and an ack; a high or low job a status entry beside its message. A long pull (Fetch,
// MoveDue) gets an idle heartbeat per 40% of its wait. No-wait fetches share one subscription
// per Queues for their replies; a long pull subscribes for its own and drains it at its end.
//
// With Options.SharedStreams, the plain queues ([Shareable]) keep their jobs in that many
// shared streams instead (shared.go): provisioning them costs the shared streams, once, and no
// consumer; a queue's consumer is made by its first worker; each stored job is republished,
// headers only, to the workers' doorbell ([Queues.Doorbell]); [Queues.Waiting] finds the queues
// that hold jobs in a listing of the shared streams and of the consumers and subjects of those
// that hold messages. The guarantees above hold for them unchanged; their leftovers go in one
// pass over the shared streams (RemoveSharedLeftovers). A queue that moves between its own
// stream and a shared one, or between counts, keeps its waiting jobs in its former stream,
// which Waiting reports, the workers drain (FormerConsumer) and then retire (RetireFormer):
// former.go. docs/design/queue.md, docs/design/scale.md and
// docs/design/time.md have the design and its history; BENCHMARKS.md ("queue") the figures.
package queue
