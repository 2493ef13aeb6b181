// Package worker drains Sluice's queues: a [Pool] pulls jobs from each queue's shared
// JetStream consumer, takes a slot of the queue's leak schedule for each, delivers it to the
// upstream, and acks, retries or dead-letters it by the upstream's answer.
//
// Model. Run one Pool per process, in as many processes and on as many hosts as you like;
// they share each queue's consumer (a job goes to one of them at a time) and its leak
// schedule (leaky.Schedule, in Redis across processes). A job in hand goes through recall
// (its status, on a redelivery), admission steps (its leak slot; no operator's cancel),
// send (one HTTP attempt, bounded by QueueConfig.Timeout), and then settle, a pure function
// from how that ended to a plan — record a status; ack, nak after a delay, hand back or
// dead-letter; pause the queue — which an executor carries out. The pool reaches NATS
// through its own [Broker] interface, which *queue.Queues satisfies. Each runner of a queue
// with a schedule stream also moves its due scheduled jobs into it (queue.Queues.MoveDue;
// the pool learns which queues have one from one watch, due.go), and fetches a queue's high
// jobs before its normal ones before its low ones, with a starvation guard (priority.go).
//
// Guarantees.
//   - The queue's aggregate delivery rate never exceeds its rate plus its burst, however
//     many workers drain it; a worker whose slot came too late gives it up rather than
//     bunching deliveries at the upstream.
//   - 2xx acks the job; 429 or 503 pauses the whole queue for the answer's Retry-After (or
//     DefaultPause) and retries without spending an attempt, at most MaxPauseRetries times;
//     other 5xx, 408, 425, timeouts and connection errors retry with Backoff until
//     MaxAttempts; other 4xx, redirects and unroutable jobs are dead-lettered at once.
//   - Attempts are counted in the job's status record, so a crash never hides a delivery the
//     upstream may have seen: Sluice-Attempt never repeats a number, and a job that kills its
//     workers is dead-lettered after MaxAttempts (+1) deliveries. A redelivered job whose
//     status is already final is acked, not delivered again.
//   - A scheduled job is never delivered before its not-before time on the worker's clock,
//     nor once canceled (its status is read first). While lower-priority jobs wait, at least
//     one of every 8 jobs a runner takes is of the lower level.
//   - Every delivery carries Sluice-Job (the job id), Sluice-Attempt, and Idempotency-Key:
//     the client's own key when it sent one, the job id otherwise.
//   - On shutdown the Pool stops fetching, hands back the jobs waiting for slots, lets
//     deliveries in flight finish within Deps.ShutdownTimeout, cuts the rest short and hands
//     them back; Run returns within ShutdownTimeout plus one second even when NATS cannot be
//     reached (the jobs it could not settle come back after their AckWait).
//
// Unit budgets. A queue with cost_rate (QueueConfig.Units) also drains within its units: a
// job waits for one slot of both budgets, charged Job.Cost (0: 1; above CostCapacity: the
// capacity, logged), and with CostFromResponse the answer's true cost (a header, or the JSON
// number at a pointer in up to 1 MiB of the body, kept only then) is charged or refunded on
// the unit schedule (leaky.CostSchedule). A refund helps only jobs that hold no slot yet, so
// a unit queue reserves units at most 20ms ahead, one job per process at a time, asking again
// every 20ms. A missing or malformed true cost leaves the estimate standing
// (sluice_cost_unreconciled_total). A 429 whose token headers say the budget is spent
// (X-RateLimit-Remaining-Tokens: 0 with -Reset-Tokens, or anthropic-ratelimit-tokens-*)
// pauses the queue until their reset when that is later than its Retry-After (at most 1h).
// An adaptive unit queue asks for fewer units when the answers' token headers say the
// upstream takes fewer (unitlearn.go), each worker from its own answers.
//
// Costs. A first delivery that ends within 100ms costs one slot take (one Redis script,
// shared with the takes of the queue's other jobs that overlap it: leaky.Coalesce), one
// status write (a create in the status bucket, or a read and a compare-and-set when an entry
// exists) and an unconfirmed ack; a redelivery or a longer delivery writes its running status
// as well, and a redelivery reads the job's record first — so does a first delivery within
// max(2×AckWait, 30s) of the Pool's start or a reconnect to NATS, when a restarted server may
// hand out again, as first deliveries, jobs whose acks it lost. The records of one fetch are
// read in one batched direct get (queue.Queues.Records). A job whose plan pauses nothing
// frees its place among Concurrency once the upstream answered, before its status write and
// ack (at most Concurrency jobs of a runner settle so); while the queue's rate holds a backlog
// back at 200/s or more, its status writes wait for the next 10 ms tick of the wall clock, so
// that every worker's writes reach NATS together (settleTick). Each fetch is a pull request;
// a runner fetches once a quarter of Concurrency is free. Concurrency must cover rate ×
// (slot-to-ack time + the longest stall) across all workers for the rate to hold. The default
// client keeps one connection per upstream dialed ahead. A unit queue's job costs a unit take
// and, with CostFromResponse, a reconciliation (one Redis script each), plus one take every
// 20ms while its units are further ahead. A place of a capped queue costs a take and a
// give-back in its store (two Redis scripts) per second or so while the cap has room,
// since the Pool gives a released place to the next delivery of the same caps
// (inflight.Reuse), and per delivery while the cap binds.
//
// The reasoning behind each rule, the sizing of Concurrency and the rejected designs are in
// docs/design/worker.md; figures are in BENCHMARKS.md.
package worker
