// Package limit decides whether a request fits its rate limit.
//
// It implements the six admission algorithms Sluice offers — token bucket, leaky bucket (a
// meter, as nginx limit_req), fixed window counter, sliding window log, sliding window counter
// and GCRA — over two stores with one behaviour: [Memory] for a single process and [Redis] for
// state shared by many replicas. Both satisfy [Limiter] and pass the same conformance tables.
// Being over the limit is a [Decision] with Allowed false, not an error; an error means the
// limiter could not decide (bad input, or the store failed).
//
// # One arithmetic
//
// The algorithms are pure functions of a small state and an instant (algorithms.go); the
// memory store runs them in Go, the Redis store runs Lua translations of them (lua/*.lua).
// Both compute in whole microseconds since the Unix epoch, the resolution of Redis TIME, and
// hold rates as exact fractions, so they decide identically, to the microsecond in every field
// of the Decision, and a rate such as 3 per second does not drift ([Limit.Validate] rejects
// the few limits whose products would not stay exact in Lua's doubles). A decision is exact
// both ways: a request retried RetryAfter later is admitted if nothing else was charged
// meanwhile, and one retried a microsecond earlier is not; the same holds for ResetAfter.
//
// # Units and Adjust
//
// A request may cost more than one unit (tokens, bytes): Decide charges cost units, at most
// [Limit.Capacity], and every algorithm counts units as it counts requests. When the true cost
// is known only afterwards, [Limiter.Adjust] reconciles it from the admitting Decision (its
// instant At and its Cost): it charges the difference or refunds it. A refund never leaves a
// key more permissive than charging the true cost at first:
//   - TokenBucket, for a Limit with Refunds (a rule that reconciles): a refund of e gives back
//     exactly what the bucket would hold now had the charge been e less: e, less what that bucket would have lost to its capacity since At,
//     that is min(e, Capacity − the highest level since At) (peaks.go), however long ago At
//     was. The highest level since At is the level just before some later charge, or the level
//     now: each key keeps a record of those levels, falling from oldest to newest (a level no
//     higher than a later one is dropped), at most 8 of them. A refund of a charge the record
//     no longer reaches (8 falling levels since, a limit changed since, a state stored before
//     the record existed) gives back what the rule below allows. Several charges in one
//     microsecond share one level: a refund of one of them but the first may give back less
//     than exact, never more, and never less than the rule below. Cost, measured
//     (BENCHMARKS.md, "limit: the token bucket's exact refund"): in memory, about 145 bytes a
//     key instead of 51, and 24 more a level beyond the first; in Redis, about 2 numbers
//     (8 bytes) a level in the key's value, the same 104 bytes a key with one level (MEMORY
//     USAGE); each token bucket script takes about 3 µs more of Redis's time with one level,
//     and about 13 µs more with a full record (22.7 against 9.2). A Limit without Refunds
//     keeps no record and pays none of this: its refunds (Envoy's negative hits, a refused
//     budget's others) take the LeakyBucket rule below.
//   - LeakyBucket, GCRA: a refund gives back at most what the bucket has not yet refilled of
//     the charge since At (Cost − rate × elapsed), never beyond a full bucket; a refund later
//     than Cost/rate returns nothing.
//   - FixedWindow: a refund uncounts from the window of At while it is current, never below
//     0. SlidingWindow: the same, and a refund also uncounts from the previous window.
//   - SlidingLog: a refund removes up to that many entries of instant At still logged.
//
// # Debt
//
// An extra charge is debt, owed in full: the token bucket goes below empty, the leaky bucket
// and GCRA above full, the windows count above Limit and each window that starts counts Limit
// of what is owed, until it is paid (a limit lowered by a reload turns a window's count above
// it into debt too). A key in debt is refused, with the RetryAfter that pays it back, and its
// state lives until then. What a key may owe is bounded by [DebtCapacities] capacities (or what
// exact arithmetic holds, for limits near 2^52): Adjust records the charge up to that cap and
// returns [ErrDebtCapped] for the rest, which callers count. SlidingLog carries no debt (its log
// holds at most Limit entries): an extra charge logs as many entries at now as fit under Limit
// and reports ErrDebtCapped for the rest; the config refuses it with cost_from_response.
//
// The bound, per algorithm, on the units that pass a key: when every request's true cost is
// charged (at admission or by Adjust) and no debt was capped, the units admitted in any span of
// time s are at most
//   - TokenBucket, GCRA, LeakyBucket: Capacity + rate × s + E;
//   - FixedWindow: Limit in any window + E; SlidingWindow: Limit in any window (as its
//     estimate counts them) + E; SlidingLog (charged its true cost, or refunded): Limit in any
//     trailing period,
//
// where E is the estimate error of the requests admitted before the first of their answers was
// reconciled: the sum of (true cost − charge) over the requests in flight, which the debt then
// takes out of the windows after. A client that under-declares gets no more over time; it only
// moves its use earlier. Adjust costs what a decision does, and nothing when used equals Cost;
// while a key owes, a sliding window decision looks at most DebtCapacities+3 windows ahead.
// docs/design/limit.md says why the refund rules are conservative; the token bucket's is exact
// because its state after a refund is that of the bucket that charged the true cost, so the
// bound above holds for it as charged (TestTokenBucketRefundBounds checks it).
//
// # Charges made once
//
// A call to Redis that timed out may still run: a stalled server runs what it had received
// when it resumes. A caller that makes again an extra charge whose Adjust failed (the ingress
// keeps them, as owed charges) would then charge it twice. A Decision's ChargeID prevents it:
// the store records the IDs of the extra charges it made (in a sorted set beside the key's
// state, in its hash slot, for [ChargeMarkTTL], the latest [MaxChargeMarks] a key) and makes a
// recorded one no more, answering [ErrChargeMade]; whichever of the two calls runs first
// charges. The cost: an extra charge with an ID runs two more commands in its script (four
// on one in 25, which trims the record): about 4 µs of the server's time and 30 bytes an ID
// (BENCHMARKS.md, "limit: charge IDs"); decisions, refunds and charges without an ID run none.
//
// # Loss of Redis's state
//
// Redis can lose the state while the processes run (a restart without persistence, a
// FLUSHALL, a failover). Every decision script checks an epoch key in the same round trip (one
// HMGET per script run, so one per DecideAll on a single Redis; one key per store, one per
// hash slot on a cluster, never expiring; on a cluster also a CLUSTER MYID, since the key names
// the node that made it and a failover counts as a loss), so a store that decided before the
// loss learns of it on its next decision and reports it (RedisConfig.OnLoss). A limit with
// OnReset ResetConservative is then refused, charging nothing, for its hold ([Limit.ResetHold]:
// the time it takes to become whole from empty) from when the loss was learned by any store;
// ResetFresh lets the key start afresh. Debt recorded before the loss is forgotten. reset.go
// and docs/store-reset.md have the details and the bounds.
//
// # Keys
//
// A store keeps one state per (algorithm, key). Limits of one algorithm on one key share it,
// so a reloaded configuration keeps counting (the buckets rescale their state to a changed
// rate); callers that apply several rules to one client put the rule's name in the key, as the
// ingress does ("rule:client"). A state whose ResetAfter has passed decides exactly as no state
// would, so the stores forget it: memory removes it as new keys arrive, Redis keys carry a TTL
// that ends then. A refund to a forgotten key does nothing; a key in debt lives until its debt
// is paid. Figures are in BENCHMARKS.md (the "limit" sections).
package limit
