// Package inflight holds concurrency places across processes: "at most N requests in flight",
// a counting semaphore whose places are leases that come back by themselves when their term
// (the hold argument) ends.
//
// # Model
//
// A [Cap] is a key and a Limit. [Store.Acquire] takes one place under every cap it is given at
// once, or none, for at most hold: held until [Store.Release] or until hold has passed, so a
// crashed holder's places come back within hold. Over a cap is a [Result] with Acquired false
// and a RetryAfter, not an error; errors mean the store could not decide. [Store.Wait] blocks
// until the places are acquired. [Memory] holds places in one process; [Redis] shares them
// among every process on the same Redis (or Redis Cluster) and prefix. [Reuse] gives a place
// one holder released to the next holder of the same caps in the process, while its cap has room.
//
// In Redis a cap is one sorted set: member = lease id, score = expiry in µs of the server's
// TIME. One script per call (lua/*.lua) counts, takes and gives back atomically; a release
// is PUBLISHed only while some process's Wait is refused a place of its key.
//
// A Redis can lose its places while their holders still use them: a restart without
// persistence, a FLUSHALL, a failover to a node without them. Each group of caps (one hash
// tag) has an epoch key made at its first use, which every script checks against the epoch
// the store knows. A store that knew one and finds none, or another, has learned of a loss:
// the group is fenced — no place granted — until the new epoch's birth plus hold − margin
// ([WithMargin]: the longest a place is used after its taking), and the store re-asserts the
// places it still has out, which are counted again when the fence ends. [WithOnLoss] reports it.
// On a Redis Cluster (a *redis.ClusterClient) the epoch key also records the node that made it:
// a failover to a replica keeps the key but may have lost the last places (replication is
// asynchronous), so a key found on another node than the one that made it is taken for a
// loss by whoever calls, and the group gets a new epoch and its fence.
//
// # Guarantees
//
//   - A cap is never exceeded: places are counted and taken atomically by one script (one
//     critical section for Memory); a place counts until released or its hold has passed.
//   - After a loss of Redis's state a cap is not exceeded either, provided some process that
//     knew the group's epoch is the first to call after the loss. A process with no place out
//     of the group for a hold (or new) cannot tell a loss from a first use: were it first, it
//     takes places at once, and the cap may hold the places in use from before besides — at
//     most twice the cap, for at most hold − margin — until a process that knew the epoch calls.
//   - On a Redis Cluster, a failover (or a slot's migration) is a loss whether or not places
//     were lost, and is fenced for every caller, new processes included. A failover without
//     Cluster (Sentinel, a replica promoted by hand) that lost recent places is not detected.
//   - The first use of a group is never fenced: a new deployment takes places at once.
//   - Releasing a lease twice, after it expired, or in a store that never gave it out is a
//     no-op: places are members named by random lease ids.
//   - Waiters are woken by releases (across processes through one pub/sub subscription per
//     store); a lost notification only delays a waiter until its re-check ([DefaultRecheck]).
//   - Redis Cluster: the keys of one Acquire must share a hash slot ({hash-tag}); [ErrCrossSlot]
//     otherwise, checked for any client before contacting the server.
//   - An Acquire that returns an error may still have taken its places (a stalled server runs
//     the script when it resumes). A [Redis] store whose call got no answer from the server
//     releases that lease in the background until two releases succeed one after the other,
//     or hold has passed, or Close (void.go): such places come back within a round trip or two
//     of Redis answering again, not after hold. A [Reuser]'s background give-backs are retried
//     likewise until their places expire.
//
// # Costs
//
// Redis: one round trip per Acquire, Release, Renew or Wait attempt (EVALSHA), and two
// releases for an attempt that failed without the server's answer; the epoch adds
// one HMGET to each script and a write per group every hold or so, no round trip, and on a
// Redis Cluster one CLUSTER MYID (under a µs of the server's time). After a loss
// each store that holds places of the group re-asserts them in one more round trip, and the
// group's places are refused for hold − margin. A held place is a sorted-set member (~50
// bytes); a key with no place held costs nothing, and a group's epoch key (~100 bytes) expires
// 2 × (2 hold − margin) after its last use. A store keeps a map entry per lease it has out.
// Memory: a map entry per lease under a mutex. A [Reuser] costs an Acquire and a Release in the
// store per place per Spare (1 s) while its caps have room, none per holder between them.
// docs/design/inflight.md has the details; figures are in BENCHMARKS.md.
package inflight
