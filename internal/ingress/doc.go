// Package ingress is Sluice's HTTP front, and the only package of Sluice that imports echo.
// [Server] decides each request against the configured rules, then forwards it to the
// upstream, rejects it (429), defers it to a queue (202), or refuses it (503) when the limiter
// store is down and a rule fails closed; it also serves the job API (POST
// /v1/queues/{queue}/jobs, GET /v1/jobs/{id}). cmd/ingress serves its Handler.
//
// # Model
//
// A request's path is cleaned first ("/api/../admin" is matched and forwarded as "/admin";
// encoded dot segments are refused with 400). Every rule whose method and path match is
// charged: the request's key under the rule (rule name, then the rule's key parts — ip,
// header:NAME, query:NAME, method, path, const:TEXT) is one limiter request, and all of them
// go in one Limiter call, one Redis round trip. The most restrictive rule decides: a violated
// rule that rejects makes a 429, whose Retry-After is the longest of the violated rules';
// else a rule that fails closed with the store down makes a 503; else the first violated
// on_limit: enqueue rule, or matching action: enqueue rule, defers the request; else it is
// forwarded. Shadow rules are charged and reported but never restrict. A request that is to be
// forwarded then takes a place of each algorithm: concurrency rule it matches (places.go),
// from an inflight.Store; a refusal there is one more violated rule, and a forwarded request
// gives its places back when its answer is finished.
//
// # Guarantees
//
//   - Absence never escapes a limit: a request without a key part (no API-key header, say)
//     shares the rule's one anonymous key; a key header or parameter repeated with different
//     values is refused with 400. The ip part is the peer address, or, from one of
//     trusted_proxies, the right-most untrusted hop of X-Forwarded-For (else Forwarded).
//   - Every response to a request that matched a rule with a limit carries the headers of the
//     policy closest to exhaustion: RateLimit-Policy and RateLimit
//     (draft-ietf-httpapi-ratelimit-headers-11) and X-RateLimit-*; a 429 adds Retry-After and
//     an application/problem+json body naming the violated policies. Every error is
//     problem+json.
//   - A remote store costs a request at most store_timeout: a circuit breaker stops calling a
//     failing store, and meanwhile rules that fail open (the default) are decided by an
//     in-process limiter with the same limits; rules that fail closed answer 503.
//   - A Reload is atomic: a request is decided and forwarded entirely under one config.
//   - Forwarding drops hop-by-hop headers (internal/httphdr), appends to X-Forwarded-For and
//     Forwarded, streams bodies both ways, and passes content coding, 1xx and upgrades through.
//   - A rule with a cost charges what the request says it costs (cost.go): read from a
//     header, the query, a JSON pointer into the first MiB of the body, the body's length or a
//     fixed number; what cannot be read costs cost_fallback (default the limit's capacity), and
//     a cost no wait could admit is answered 422, not charged. With cost_from_response, the
//     difference to the answer's true cost is charged or refunded to the key once the answer is
//     finished (reconcile.go), within what limit.Adjust allows.
//   - A 202 and a queued job's status carry eta, an estimate from a reading of the queue at
//     most a second old; a fair queue's tenant at its tenant_max_depth gets 429 (exact within
//     this process, others' jobs seen at the next reading).
//
// # Costs
//
// A request's scratch state (its charges, one per charged rule) is pooled: deciding it
// allocates the string of its keys and its rate-limit headers. A remote decision is one round
// trip on the request's own goroutine; a 429 for a key the store rejected is answered from a
// cache of its rejections without one, and a lease: N rule asks once per N requests of a key.
// A concurrency rule adds two round trips to a request it forwards, one to take its place and
// one, after the answer, to give it back; neither starts a goroutine.
// A cost read from the body reads it ahead once, at most 1 MiB, and passes it on whole; a
// reconciled rule keeps at most 1 MiB of the answer and costs one store round trip after it.
// A deferral adds no round trip of its own to the publish but one reading of its queue a
// second (outlook.go).
// The metrics are listed in README.md, figures in BENCHMARKS.md, design history and rejected
// alternatives in docs/design/ingress.md.
package ingress
