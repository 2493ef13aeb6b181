// Package inflight holds concurrency places across processes: "at most N requests in flight",
// a counting semaphore whose places are leases that come back by themselves when their term
// (the hold argument) ends.
//
// # Model
//
// A [Cap] is a key and a Limit. [Store.Acquire] takes one place under every cap it is given at
// once, or none (all-or-nothing), for at most hold: the place is held until [Store.Release]
// gives it back or hold has passed, whichever comes first, so a holder that crashed frees its
// places within hold. Over a cap is a [Result] with Acquired false and a RetryAfter, not an
// error; errors mean the store could not decide. [Store.Wait] blocks until the places are
// acquired. [Memory] holds places in one process; [Redis] shares them among every process that
// uses the same Redis (or Redis Cluster) and prefix. [Reuse] wraps a store so that a place one
// holder released goes to the next holder of the same caps in the process without a round
// trip, while its cap has room.
//
// In Redis a cap is one sorted set: member = lease id, score = the place's expiry in µs of the
// server's TIME (one clock for every host). The acquire script (lua/acquire.lua) drops expired
// members, checks every cap, and only when all have room adds the lease to all and PEXPIREs
// each key to the latest expiry it holds. The release script removes the lease and, when it
// freed a live place and a process waits on one of its keys, PUBLISHes them on the store's channel.
//
// # Guarantees
//
//   - A cap is never exceeded: places are counted and taken atomically by one script (one
//     critical section for Memory); a place is not counted once its hold has passed, and not
//     freed before, unless released.
//   - Releasing a lease twice, after it expired, or in a store that never gave it out is a
//     no-op: places are members named by random lease ids, so a release frees only its own.
//   - Waiters are woken by releases: in this process at once, in other processes through one
//     Redis pub/sub subscription per store. A lost notification only delays a waiter until its
//     fallback re-check: the earliest expiry of a full cap, capped at [DefaultRecheck].
//   - Redis Cluster: the keys of one Acquire must hash to one hash slot; put one {hash-tag} in
//     every key. Redis checks it for any client, so code tested on one server keeps working on
//     a cluster, and returns [ErrCrossSlot] before contacting the server.
//   - An Acquire that returns an error (a timeout, ctx ended) may still have taken its places
//     on the server; they come back after hold.
//
// # Costs
//
// Redis: one round trip per Acquire (EVALSHA), one per Release, one per Wait attempt. A release
// publishes a message only while some process's Wait was refused a place of one of its keys
// (a refusal marks the full caps as waited for), and each store then wakes one waiter, which
// tries again: a release costs an attempt per process, not one per waiting job. A held place
// is one sorted-set member (~50 bytes); a key with no place held costs nothing (deleted when
// emptied, or gone with its TTL). Memory: a map entry per lease under a mutex, expired places
// dropped as keys are touched or new keys arrive. A [Reuser] costs an Acquire and a Release
// in the store per place per Spare (1 s) while its caps have room, none per holder between
// them. docs/design/inflight.md has the details; figures are in BENCHMARKS.md.
package inflight
