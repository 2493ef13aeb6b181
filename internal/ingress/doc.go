// Package ingress is Sluice's HTTP front, and the only package of Sluice that imports echo.
// [Server] decides each request against the configured rules, then forwards it to the
// upstream, rejects it (429), defers it to a queue (202), or refuses it (503) when the limiter
// store is down and a rule fails closed. It also serves the job API (POST
// /v1/queues/{queue}/jobs, GET /v1/jobs/{id}). cmd/ingress serves its Handler.
//
// # Model
//
// A request's path is cleaned first ("/api/../admin" is matched as "/admin"; encoded dot
// segments get 400). Every rule whose method and path match is charged: the request's key
// under the rule (rule name, then its key parts) is one limiter request. The requests that no
// lease and no cached rejection answers go to the limiter in one call (Decide for one,
// DecideAll for several); a lease: N rule whose lease the store refused is asked once more,
// for the request alone. The most restrictive rule decides: a violated rule that rejects makes
// a 429 with the longest Retry-After of the violated rules; else a rule that fails closed with
// the store down makes a 503; else the first violated on_limit: enqueue rule, or a matching
// action: enqueue rule, defers the request; else it is forwarded. Shadow rules are charged and
// reported but never restrict. A request to be forwarded then takes a place of each
// concurrency rule it matches (places.go, an inflight.Store); a refusal there is one more
// violated rule, and the places go back when the answer is finished.
//
// # Guarantees
//
//   - Absence never escapes a limit: a request without a key part shares the rule's one
//     anonymous key; a key header or parameter repeated with different values gets 400. The ip
//     part is the peer, or, from a trusted proxy, the right-most untrusted hop.
//   - Every response to a request that matched a rule with a limit carries the headers of the
//     policy closest to exhaustion (RateLimit-Policy, RateLimit, X-RateLimit-*); a 429 adds
//     Retry-After and a problem+json body naming the violated policies. Every error is
//     problem+json.
//   - A remote store costs a request at most store_timeout: a circuit breaker stops calling a
//     failing store, and meanwhile rules that fail open are decided by an in-process limiter
//     with the same limits; rules that fail closed answer 503.
//   - A Reload is atomic: a request is decided and forwarded entirely under one config.
//   - Forwarding drops hop-by-hop headers (internal/httphdr), appends to X-Forwarded-For and
//     Forwarded, replaces X-Forwarded-Host and -Proto, drops a client's X-Real-IP and
//     True-Client-IP (and underscore spellings of all of them), streams bodies both ways, and
//     passes content coding, 1xx and upgrades through.
//   - A rule on a path also matches its format-suffix twins (format_suffixes: "/api/orders.json"
//     under "/api/orders"), and an Authorization key part reads the bearer scheme in any case.
//   - A rule with a cost charges what the request says it costs (cost.go); what cannot be read
//     costs cost_fallback, and a cost no wait could admit gets 422. With cost_from_response the
//     difference to the true cost is reconciled once the answer is finished (reconcile.go);
//     an extra charge the store fails is kept (at most 4096) and made after the next
//     reconciliation that succeeds (owed.go). A rule's budgets (input and output tokens) pass a
//     request only together: when one refuses, the others' charges are given back at once,
//     one more round trip (budgets.go). A streamed answer (text/event-stream, JSON lines) is
//     passed on unbuffered, each chunk flushed, and read event by event for its usage as it
//     passes (cost.Stream); one cut short (client gone, upstream reset, timeout) is charged as
//     cost_on_cut says: its estimate, or what its events said. Forwarded requests are full
//     duplex (fullDuplex), so an upstream may stream its answer while the request body's end is
//     still being read.
//   - A 202 and a queued job's status carry eta, from a reading of the queue at most a second
//     old. Every door into a queue (direct, deferred, scheduled, priority) passes its
//     admission ledger (package queue): max_depth, a tenant's tenant_max_depth and a deferring
//     rule's max_waiting_per_key per key hold exactly, answered 429 (docs/security.md).
//   - Sluice-Priority: high is kept only from the tenants and keys a queue's priorities name
//     (claims.go); a forwarded request's Idempotency-Key is scoped to its tenant as its
//     deferral's deliveries are (queue.UpstreamKey).
//
// # Costs
//
// A request's scratch state is pooled: deciding it allocates the string of its keys and its
// rate-limit headers. A remote decision is one round trip on the request's own goroutine,
// shared with concurrent requests' (limit.RedisConfig.MaxBatch); a cached rejection needs
// none, and a lease: N rule asks about once per N requests of a key. A concurrency rule adds two
// round trips to a forwarded request, to take and to give back its place. A cost read from the
// body reads at most 1 MiB ahead; a reconciled rule keeps at most 1 MiB of the answer (of a
// streamed one, at most one line of 1 MiB, about 0.8 µs of scanning an event) and costs one
// round trip after it. A deferral adds one reading of its queue a second
// (outlook.go). With Options.Tracer set, a request is a span (the client's traceparent its
// parent) with spans for its decision, its enqueue (whose context the job keeps) and its
// forward (whose traceparent the upstream gets), trace.go; without, tracing costs a nil check
// and a client's traceparent passes through untouched (docs/tracing.md). Figures are in BENCHMARKS.md; design history and rejected alternatives in
// docs/design/ingress.md.
package ingress
