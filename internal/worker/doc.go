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
//     Concurrency, so no held message's AckWait runs out while it waits. A job held longer than
//     a third of AckWait is kept alive with InProgress.
//  2. With the job in hand it takes a leak slot and sleeps until it, then checks that the queue
//     is not paused. When the schedule's store (Redis) cannot be reached it does not deliver:
//     it retries with a backoff capped at 200ms, so delivery resumes within a second of the
//     store's return, and the job is kept alive meanwhile.
//  3. It delivers the job, recording its status as running, with its attempt number, while
//     the request is on its way (a status write before it would delay the request past its
//     slot and bunch deliveries up at the upstream): a deferred request to QueueConfig.Upstream + the original path and query, with the
//     original method, headers and body; a directly submitted job to the queue's Target with
//     its body and Content-Type. Every delivery carries Idempotency-Key: <job id> and
//     Sluice-Attempt: <attempt number>. Timeout bounds each attempt.
//  4. The outcome, classified by retry.Classify:
//     - 2xx: status succeeded, ack.
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
// (queue.Status.Attempts), which the worker writes with each delivery (state running,
// attempts n) and after it (the outcome, written only once the first write has landed). A
// pause retry writes the count back to n-1. A worker that dies mid-delivery leaves attempts
// at n: the upstream may have seen the request, so the attempt counts. One that dies before
// delivering leaves it unchanged, and so, rarely, does one that dies in the millisecond
// between sending the request and recording it: that job gets one attempt more.
//
// Pause retries are not stored: they are the job's deliveries that spent no attempt,
// Msg.Delivered - Status.Attempts. That count also includes redeliveries after a crash before
// delivery and hand-backs at shutdown, so the bound is conservative: a job never gets more
// than MaxPauseRetries pause retries, and exceptionally a few fewer.
//
// A redelivered job (Delivered > 1) whose status is already final, because its worker died
// between recording the outcome and acking, is acked without delivering it again.
//
// The Sluice-Attempt header is the attempt number of the delivery: a retry after a 429 or 503
// repeats the number of the attempt the upstream refused, since that attempt was not spent.
//
// # Shutdown
//
// When Run's context is cancelled the Pool stops fetching, hands back (Nak, for immediate
// redelivery elsewhere) every job still waiting for a slot, lets deliveries in flight finish
// within Deps.ShutdownTimeout, hands back those it had to cut short, and returns.
package worker
