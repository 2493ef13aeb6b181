// Package inflight holds concurrency places across processes: "at most N requests in flight",
// a counting semaphore whose places are leases that come back by themselves after a hold.
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
// server's TIME (one clock for every host). The acquire script (lua/acquire.lua) drops the
// expired members of every key, checks every cap, and only when all have room adds the lease
// to all and PEXPIREs each key to the latest expiry it holds. The release script removes the
// lease and, when it freed a live place, PUBLISHes the keys on the store's channel.
//
// # Guarantees
//
//   - A cap is never exceeded: places are counted and taken atomically by one script (one
//     critical section for Memory); a place is not counted once its hold has passed, and not
//     freed before, unless released.
//   - Releasing a lease twice, after it expired, or in a store that never gave it out is a
//     no-op: places are members named by random lease ids, so a release frees only its own.
//   - Waiters are woken by releases: in this process at once, and in other processes through
//     one Redis pub/sub subscription per store. A lost notification only delays a waiter until
//     its fallback re-check: the earliest expiry of a full cap, capped at [DefaultRecheck].
//   - Redis Cluster: the keys of one Acquire must hash to one slot; put one {hash-tag} in
//     every key. Redis checks it for any client, so that code tested on one server keeps
//     working on a cluster, and returns [ErrCrossSlot] before contacting the server.
//   - An Acquire that returns an error (a timeout, ctx ended) may still have taken its places
//     on the server; they come back after hold.
//
// # Costs
//
// Redis: one round trip per Acquire (EVALSHA), one per Release, one per Wait attempt. A
// Release that frees a place publishes one message only while a Wait of some process is
// refused a place of one of its keys (a refused attempt marks the full caps as waited for,
// atomically with the refusal, for four times the re-check interval, and each further attempt
// renews the mark), and each store with waiters on one of its keys wakes the longest of them
// not yet woken, which tries again (one round trip): a release costs an attempt per process,
// not one per waiting job. Releases that nobody waits for cost no message: an uncapped drain
// under a cap it never reaches, or the ingress's concurrency rules, which never wait. While
// processes of an older version wait on the same keys (a rolling upgrade), they are not
// marked, and are woken by their re-check instead. A held place costs one sorted-set
// member (a 26-byte id and a score, ~50 bytes in a listpack); a key with no place held costs
// nothing: a key emptied by releases is deleted by Redis at once, and one whose places all
// expired disappears with its TTL, the latest expiry it held. Memory: a map entry per lease
// under a mutex, expired places dropped when their key is next touched, empty keys deleted,
// and keys left with only expired places swept as new keys arrive. A [Reuser]: an Acquire
// and a Release in the store per place per Spare (1 s) while its caps have room, none per
// holder between them; a map entry per place held or kept, a timer while some are kept.
// Figures are in BENCHMARKS.md.
package inflight
