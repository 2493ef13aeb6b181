// Package worker drains Sluice's queues: it pulls jobs from each queue's shared JetStream
// consumer, takes a slot from the queue's leak schedule for each, delivers the job to its
// upstream, and acknowledges, retries or dead-letters it by the upstream's answer.
//
// A [Pool] drains any number of queues; run one per process, in as many processes and on as
// many hosts as you like. cmd/worker runs a Pool standalone ([Main]); the ingress's quickstart
// runs one in-process. Every Pool of a queue shares its leak schedule (leaky.Schedule, in Redis
// across processes), so the queue's aggregate delivery rate never exceeds its rate (plus its
// burst) however many workers drain it.
//
// # One job
//
//  1. The Pool fetches jobs in small batches, never holding more of a queue than its
//     Concurrency, so no held message's AckWait runs out while it waits. While some jobs in
//     hand still wait for their slots it fetches only once a quarter of Concurrency is free;
//     when none does (the upstream, not the rate, is the bottleneck) it fetches for every place
//     that frees up. A job held longer than a third of AckWait is kept alive with InProgress.
//  2. With the job in hand it takes a leak slot and sleeps until it, then checks that the queue
//     is not paused. When the schedule's store (Redis) cannot be reached it does not deliver:
//     it retries with a backoff capped at 200ms, so delivery resumes within a second of the
//     store's return, and the job is kept alive meanwhile.
//  3. It delivers the job: a deferred request to QueueConfig.Upstream + the original path and
//     query, with the original method, headers and body; a directly submitted job to the
//     queue's Target with its body and Content-Type. Every delivery carries Idempotency-Key:
//     <job id> and Sluice-Attempt: <attempt number>. Timeout bounds each attempt. The status
//     is recorded as running, with the attempt number, while the request is on its way (a
//     status write before it would delay the request past its slot and bunch deliveries up at
//     the upstream): at once for a redelivery, and for a first delivery only once it has
//     lasted 100ms (see Counting attempts).
//  4. The outcome, classified by retry.Classify:
//     - 2xx: status succeeded, then ack. The ack is not confirmed (queue.Msg.AckNoWait): were
//     it lost, JetStream would hand the job out again after AckWait, and its worker would find
//     the status final and ack it without delivering it (below). When the status write
//     failed, the ack waits for the server's confirmation.
//     - 429 or 503: the whole queue pauses (leaky.Schedule.Pause, seen by all workers) for the
//     response's Retry-After, or QueueConfig.DefaultPause without one, and the job is naked
//     with that delay WITHOUT spending its attempt; after MaxPauseRetries such retries it is
//     dead-lettered.
//     - other 5xx, 408, 425, timeouts, connection errors: naked with the backoff delay of the
//     attempt (Backoff.Delay, or the response's Retry-After when longer) until MaxAttempts
//     attempts are spent, then dead-lettered.
//     - other 4xx, redirects, a job the queue cannot route: dead-lettered at once.
//
// # Counting attempts
//
// JetStream's delivery count cannot tell attempts apart from pause retries, crash redeliveries
// and jobs handed back at shutdown, so the spent attempts live in the job's status record
// (queue.Status.Attempts), which the worker writes after each delivery (the outcome: attempts
// n) and, for a redelivery or a delivery that lasts, during it (state running, attempts n;
// the outcome is written only once that write has landed). A pause retry writes the count
// back to n-1. A worker that dies during a redelivery, or during a first delivery that has
// lasted 100ms, leaves attempts at n: the upstream may have seen the request, so the attempt
// counts. One that dies before delivering leaves it unchanged, and so does one that dies
// within the first 100ms of a job's first delivery (or, rarely, in the millisecond between
// sending a redelivery and recording it): that job gets one attempt more. As every attempt
// after the first is recorded at once, a job whose delivery kills its workers is still
// dead-lettered after MaxAttempts (+1) deliveries.
//
// Writing the running record only for first deliveries that last saves, for the great
// majority of jobs, one of their two status writes, each a read and a compare-and-set in the
// status bucket: two of the job's NATS round trips, and the largest single saving measured
// (BENCHMARKS.md, "worker — drain"). A client polling the job sees running for any first
// delivery that lasts long enough to be seen; a faster one goes from queued straight to
// succeeded (or retrying, or failed).
//
// Pause retries are not stored: they are the job's deliveries that spent no attempt,
// Msg.Delivered - Status.Attempts. That count also includes redeliveries after a crash before
// delivery and hand-backs at shutdown, so the bound is conservative: a job never gets more
// than MaxPauseRetries pause retries, and exceptionally a few fewer.
//
// A redelivered job (Delivered > 1) whose status is already final, because its worker died
// between recording the outcome and acking or its unconfirmed ack was lost, is acked without
// delivering it again.
//
// # Sizing Concurrency
//
// With a backlog, every job in hand takes its leak slot at once and sleeps until it, so the
// jobs in hand of all workers together reserve the queue's next slots. The schedule does not
// bank slots nobody took (beyond Burst), so the rate holds only while some job always holds
// the next slot: workers × Concurrency × ¾ (a worker refetches when a quarter is free) must
// exceed rate × (the time from a job's slot to its ack, plus the longest stall a worker may
// suffer). At 2000/s with 4 workers, Concurrency 64 reserves about 100ms ahead; the default
// 4, with a few workers, suits rates up to a few hundred per second.
//
// A fair queue (QueueConfig.Fair) is drained the same way, with two differences: every Pool
// runs the queue's scheduler (queue.Fair, of which one leads across all processes), and a
// runner holds at most a twentieth of a second of the rate's jobs waiting for their slots
// (fairLookahead), because the jobs in hand are delivered before whatever the scheduler picks
// next. Concurrency then bounds only the deliveries in flight.
//
// The Sluice-Attempt header is the attempt number of the delivery: a retry after a 429 or 503
// repeats the number of the attempt the upstream refused, since that attempt was not spent.
// Every status a worker writes records the JetStream delivery count it wrote it at; a later
// delivery counts the deliveries in between that left no record (a worker killed after
// sending, a lost ack) as spent attempts, so a redelivery never repeats a number the upstream
// may have seen. A job handed back before it was sent records that, and is not counted.
//
// # Connections to the upstream
//
// A delivery that needs a new connection would wait for TCP's handshake after its slot, which
// on a loaded machine takes longer than a slot may be late; a worker's first deliveries, and
// any beyond the connections it keeps alive, would reach the upstream late and next to the
// on-time ones after them. So the Pool's own client keeps one connection to each upstream
// dialed ahead (spares, warmed when a job starts waiting for its slot), which its transport
// takes when it needs a new connection. A spare the upstream has closed, or one older than
// 30s, is dialed afresh. A client given in Deps.HTTP dials as it likes.
//
// # Shutdown
//
// When Run's context is cancelled the Pool stops fetching, hands back (Nak, for immediate
// redelivery elsewhere) every job still waiting for a slot, lets deliveries in flight finish
// within Deps.ShutdownTimeout, hands back those it had to cut short, and returns.
package worker
