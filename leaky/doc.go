// Package leaky is the queue-wide leak schedule: the fixed drain rate shared by every worker of
// a queue, whether they run in one process or in many processes on many machines.
//
// # Model
//
// Each delivery takes a slot. Slots are spaced one [Rate.Interval] apart; after idleness up to
// [Rate.Burst] extra slots are available at once. A queue's state is GCRA's theoretical arrival
// time (TAT) of its latest reservation; a take moves it one interval on and hands out a slot up
// to Burst intervals before it, never before now. A take always succeeds, "go now" or "your
// slot is at t", so a worker sleeps until its slot instead of polling. The interval travels
// with every take, so a rate change applies from the next slot. [Schedule.Pause] moves the
// schedule past an upstream's Retry-After for every worker at once and uses up the burst;
// [Wait] wakes 10ms before a slot to check whether the queue was paused (or its Redis state
// lost) meanwhile, and if so sleeps the pause out and takes a new slot. Above [StrictRate] its
// sleeps end on a [Grid] of 2.5ms instead, and it checks at the slot: the slots a process
// holds then wake, check and go a few at a time, not each on its own wake-up.
//
// A queue may also have a unit budget ([Units]: N units such as tokens per period).
// [CostSchedule.TakeCost] reserves one slot at the later of the request schedule's and the
// unit schedule's next slot and advances both from it, so neither budget idles waiting for the
// other; the unit schedule is GCRA paid after, moved on by the job's cost.
// [CostSchedule.Reconcile] charges or refunds the difference of the true cost; a refund moves
// the TAT back, but never behind a slot reserved after the refunded job's take. [Ask.Ahead]
// lets a take reserve no units far ahead, so that refunds reconciled meanwhile reach the job.
//
// [Memory] keeps the schedule in one process (the quickstart). [Redis] shares it through one
// {hash-tagged} hash per queue, changed by one Lua script per call on the server's TIME; each
// process places slots on its own monotonic clock within bounds its round trips set, at the
// latest bound, so never early. Idle state expires a minute after it stops mattering.
//
// # Guarantees
//
//   - With a backlog, all workers together deliver at the rate, never above it (plus Burst).
//   - A slot is used on time or not at all: [Wait] gives up a slot it wakes for more than
//     [Rate.Tolerance] late and takes a new one, so any one-second window holds at most
//     rate + Burst + 1 deliveries up to [StrictRate] (200/s), and at most 1% more above.
//   - With a unit budget, in any window of Per the jobs delivered hold at most N + Burst units
//     plus one job's cost, counting true costs once reconciled. A refund never makes the
//     schedule more permissive than charging the true cost at the take.
//   - A pause stops every slot due more than 20ms after it, and every slot not yet released in
//     the process that made it.
//   - Redis state lost (a restart, a failover) restarts the schedule at now and voids every
//     earlier reservation: only slots due within 20ms of the loss can still go. While Redis is
//     unreachable, takes return an error.
//
// # Costs
//
// One Redis round trip per take, one per slot reserved more than 1ms ahead (the pause check)
// unless the process read the queue's state in the 10ms before it (nearly always at a
// throttled rate; the checks that find it older share one round trip), one per
// reconciliation. At 2 000/s over 4 workers that is 0.27 round trips per slot. [Coalesce] serves the overlapping takes of a queue
// with one [BatchTaker.TakeN] call, so at thousands of slots a second one round trip carries
// several. Memory takes without allocating. A given-up slot is one delivery the queue does not
// make, and a reservation whose waiter's context ends is not given back: accuracy is bought
// with throughput, never the other way. [Hooks.Clock] lets tests drive a wait on a fake clock.
// Figures are in BENCHMARKS.md; the history of these rules in docs/design/leaky.md.
package leaky
