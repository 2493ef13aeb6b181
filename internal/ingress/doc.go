// Package ingress is Sluice's HTTP front: it decides each request against the configured
// rate-limit rules and forwards it to the upstream, rejects it (429), defers it to a queue
// (202), or refuses it (503) when the limiter store is down and a rule fails closed. It also
// serves the job API (POST /v1/queues/{queue}/jobs, GET /v1/jobs/{id}). It is the only
// package of Sluice that imports echo.
//
// There are two ways in:
//
//   - [Gate] (or [Middleware]) is echo middleware for any echo app: rule matching, keys,
//     decisions, headers, shadow mode, the store circuit breaker and deferral.
//   - [Server] is the standalone ingress: a Gate in front of a reverse proxy to the config's
//     upstream, plus the job API. cmd/ingress serves its Handler.
//
// # Matching and keys
//
// A rule matches by method and path (exact, or a prefix written "/prefix/*"). Paths are
// matched after cleaning: "/api/../admin" is matched, and forwarded, as "/admin"; a path
// whose dot segments are percent-encoded ("/api/%2e%2e/admin") is refused with 400.
//
// A request's key under a rule is built from the rule's key parts: ip, header:NAME,
// query:NAME, method, path, const:TEXT. The ip part is the peer address; when the peer is
// one of trusted_proxies it is the right-most address of X-Forwarded-For (or, when that
// header is absent, of Forwarded, RFC 7239) that is not itself a trusted proxy. Only one of
// the two headers is read: make sure the trusted proxies set (or strip) X-Forwarded-For. A
// part the request lacks — no API-key header, say — puts the request under the rule's one
// shared anonymous key: leaving a header out never escapes a limit.
//
// # Decisions
//
// Every matching rule is charged, in one Limiter.DecideAll call (one Redis round trip), and
// the most restrictive decides: a rejection by any rule not in shadow mode rejects with 429,
// Retry-After being the longest of the rejecting rules'. Rules with on_limit: enqueue defer
// the request to their queue instead, and rules with action: enqueue defer every request
// they match; the first such rule in file order names the queue. A 429 wins over a deferral.
//
// Every response to a request that matched a rule with a limit carries the headers of the
// policy closest to exhaustion (lowest remaining, then longest reset): RateLimit-Policy and
// RateLimit (draft-ietf-httpapi-ratelimit-headers-11) and X-RateLimit-Limit, -Remaining and
// -Reset (seconds). A 429 also carries Retry-After and X-RateLimit-Retry-After, and an
// application/problem+json body of type quota-exceeded naming the violated policies.
//
// # When the limiter store fails
//
// With a remote limiter (Redis), each call is bounded by store_timeout, and a circuit
// breaker stops calling a store that failed 5 times in a row, letting one probe through each
// second until the store answers again. Meanwhile rules that fail open (on_store_error:
// allow, the default) are decided by an in-process limiter with the same limits — each
// process then enforces the limit on its own — and rules that fail closed answer 503 with
// Retry-After. The sluice_decisions_total outcomes fail_open and fail_closed count them.
//
// # Metrics
//
//	sluice_decisions_total{rule,outcome}  allowed, rejected, shadow, fail_open, fail_closed, enqueued
//	sluice_decision_duration_seconds      the decision, store round trip included
//	sluice_store_errors_total             limiter store calls that failed or timed out
//	sluice_breaker_state                  0 closed, 1 half-open, 2 open
//	sluice_requests_total{code}           answers by status code (Server only)
//	sluice_upstream_errors_total          forwarded requests without an upstream response
//	sluice_ingress_reloads_total{result}  Reload calls, ok or error
//
// # Forwarding
//
// The Server forwards with httputil.ReverseProxy: hop-by-hop headers are dropped, the client's
// X-Forwarded-For and Forwarded chains are appended to, and bodies stream both ways. Content
// coding passes through untouched: a request without Accept-Encoding reaches the upstream
// without one, and an encoded answer reaches the client as the upstream sent it. Informational
// answers (103 Early Hints) are passed on before the final one; protocol upgrades (101) are
// proxied.
//
// # Bad input
//
// Request headers are bounded by the http.Server's MaxHeaderBytes (max_header_bytes in the
// config; cmd/ingress sets it). Bodies of deferred requests and jobs are bounded by their
// queue's max_body_bytes (413). Malformed forwarding headers are ignored in favour of the
// peer address. CONNECT and TRACE are not forwarded (405); every error is problem+json.
package ingress
