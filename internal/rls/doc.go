// Package rls is Sluice as Envoy's rate-limit service: it answers
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit over gRPC, as
// envoyproxy/ratelimit does, counting with Sluice's limiters (package limit: memory or Redis).
//
// # Model
//
// A [Domains] is a directory of domain files in envoyproxy/ratelimit's YAML format, read as it
// is (domain, descriptors, key, value, rate_limit with unit, requests_per_unit, unlimited, name
// and replaces, shadow_mode, quota_mode, detailed_metric, value_to_metric, share_threshold), plus one key of
// Sluice's: a descriptor's rule: NAME puts one of the config's rules behind it, so any of
// limit's algorithms, the rule's shadow and on_store_error apply. A request descriptor is
// matched as envoyproxy/ratelimit matches it: at each depth "key_value", then the first
// wildcard "key_prefix*" of that level, then the bare "key"; a limit counts only at the depth
// of the descriptor's last entry; the values a share_threshold wildcard matches share one
// counter. A descriptor's own limit (override) replaces the rate.
// Limits whose name another matched limit replaces are not applied. An unlimited limit
// answers OK with limit_remaining 4294967295.
//
// Each descriptor is counted under the key domain + its entries (each value of a wildcard or
// bare key apart, as there); a plain rate_limit is a fixed window of requests_per_unit per unit
// aligned to the epoch, as there. The cost is the descriptor's hits_addend, else the request's,
// else 1; a descriptor's hits_addend of 0 is a check, decided at 1 and given straight back.
// A quota_mode limit over its limit answers OK and is named in dynamic_metadata, as there.
// A rule with global: true is decided against the region's part of its limit
// (Options.RegionalLimit, the HTTP path's regions.Holder): a part that admits nothing is
// OVER_LIMIT without a store call, until the region's next renewal.
// Every charge of one call goes to the
// store in one round trip. An is_negative_hits descriptor gives units back with
// limit.Limiter.Adjust, within the limits' refund rules, from the charges this process
// admitted on that key within the limit's period (the latest first); units it cannot match are
// counted in sluice_rls_units_unrefunded_total and dropped, never credited beyond a charge.
//
// # Answers
//
// One status per descriptor, in order, with current_limit, limit_remaining and
// duration_until_reset (limit.Decision.ResetAfter: the end of the window, or when a bucket is
// whole again), and the overall code: OVER_LIMIT when any descriptor is over and not in shadow
// mode. response_headers_to_add carries the HTTP path's RateLimit, RateLimit-Policy and
// X-RateLimit-* headers of the descriptor closest to exhaustion, and on OVER_LIMIT Retry-After,
// Content-Type and, as raw_body, the ingress's problem+json of a 429.
//
// # Guarantees
//
// A store failure is never an RPC error: descriptors that fail open (the rule's or the
// config's on_store_error: allow, or shadow) are decided by an in-process limiter, the others
// are OVER_LIMIT, counted as fail_closed. Decisions are counted in sluice_decisions_total{rule,
// outcome} beside the HTTP path's (the rule label is the Sluice rule, else rate_limit.name,
// else "rls:domain.key_value.key"). A reload of the directory that does not compile keeps the
// domains in force; its error names the file and the field.
//
// # Costs
//
// One store round trip per call (DecideAll: one EVALSHA per counted descriptor, pipelined, and
// shared with concurrent calls'), plus one per refunded charge and per check. Not one Lua call
// for all the descriptors: their keys are in different Redis Cluster slots. The handler
// allocates the answer's messages a slice per kind, caches each policy's current_limit and
// the label-bound counters, and takes one of 32 locks (by key) to remember an admitted charge:
// about 52 allocations for a call of two descriptors, go-redis's included. gRPC calls are served
// by 64 stream workers, which keep the stacks they grew. The refund memory holds at most 4
// charges per key and 65 536 keys. Redis's share is the larger: an EVALSHA costs Redis 13–16 µs
// where envoyproxy/ratelimit's INCRBY and EXPIRE cost about 2.4. Figures: BENCHMARKS.md, "rls".
package rls
