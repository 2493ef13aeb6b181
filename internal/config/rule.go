package config

import (
	"slices"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/limit"
)

// Rule is one rate-limit rule: which requests it applies to, how it keys them, the limit and
// what happens above it.
type Rule struct {
	// Name is the rule's name, reported in headers, problem bodies and metrics. Required and
	// unique among rules.
	Name string
	// Match selects the requests the rule applies to. Default: every request.
	Match Match
	// Key is the parts that make up a request's limiter key, in order. Default [ip].
	Key []KeyPart
	// Algorithm, Limit, Period and Burst are the limit: Limit requests per Period, decided
	// by Algorithm, with Burst as limit.Limit documents it (0: the algorithm's default).
	// Required when Action is ActionLimit. When Action is ActionEnqueue they are optional,
	// and validated all the same when Algorithm is set.
	Algorithm limit.Algorithm
	Limit     int64
	Period    time.Duration
	Burst     int64
	// OnLimit is what happens to a request over the limit (YAML on_limit). Default
	// OnLimitReject.
	OnLimit OnLimit
	// Action is what the rule does with a matching request. Default ActionLimit.
	Action Action
	// Queue names the queue that OnLimitEnqueue and ActionEnqueue send requests to; it must
	// name a queue of the config. Required by either of them, "" otherwise.
	Queue string
	// MaxWaitingPerKey is the rule's deferral budget (YAML max_waiting_per_key): how many of
	// one key's requests the rule may have waiting in its queue at once, scheduled and in
	// flight included; beyond it the key's next deferral is refused with 429 while other keys'
	// are still deferred, so one key cannot fill a queue. 0: the default, WaitingPerKey's.
	// Only rules that defer (a queue) have one.
	MaxWaitingPerKey int64
	// Shadow makes the rule count and report only, never block or defer.
	Shadow bool
	// Global shares the rule's limit (per key) with the other regions (YAML global): this
	// region's ingress decides each key against its lease's share of Limit and Burst. Needs
	// Config.Region and Config.Regions, a limit with a period (not concurrency), and a name
	// of A-Z, a-z, 0-9, _ and -. Default false.
	Global bool
	// OnStoreError overrides Config.OnStoreError for this rule (YAML on_store_error).
	// "": inherit the global mode; see StoreErrorMode.
	OnStoreError StoreErrorMode
	// OnStoreReset is what the rule admits after Redis lost its state (YAML on_store_reset):
	// limit.ResetFresh (the default) lets the algorithm start afresh, limit.ResetConservative
	// refuses the rule's requests until the limit would be whole again (one period for the
	// windows); docs/store-reset.md. Only rules with a limit per period have one.
	OnStoreReset limit.ResetMode
	// Timeout is, for an AlgorithmConcurrency rule only, the longest a request the rule caps
	// may take at the upstream, from its forwarding to the end of its answer's body (YAML
	// timeout; default DefaultRuleTimeout, at most 24h): the ingress cuts off a forwarded
	// request still running then, so a place is never given up while its request may still
	// be at the upstream, and a place whose ingress died comes back within Timeout plus a
	// second. 0 for every other rule.
	Timeout time.Duration
	// Lease is how many requests of a key an ingress takes from the shared store at once and
	// then admits by itself (YAML lease), for limits where admitting up to Lease more per
	// ingress is acceptable; 0 (the default) asks the store for every request. It applies only
	// with redis, and never more than the limit itself.
	Lease int64
	// Cost is what one request costs in the limit's units (YAML cost); the default costs 1.
	// It is a source or an expression of them (ParseCost: max, sum or +, a whole factor,
	// prompt_tokens), so that an LLM request can be charged its prompt estimate plus its
	// completion bound. Only rules with a limit per period have one; a request whose cost
	// exceeds the limit's capacity is refused (422), never charged forever.
	Cost Cost
	// CostFallback is the cost of a request whose cost cannot be read (YAML cost_fallback);
	// 0: the limit's capacity (see Fallback).
	CostFallback int64
	// CostFromResponse reads a forwarded request's true cost from the upstream's answer (YAML
	// cost_from_response, header:NAME or json:<pointer>, or sums, maxima and factors of them):
	// the difference from the charged cost is charged or refunded to the request's key; what
	// is owed is paid across windows (limit.DebtCapacities). Not with sliding_log, which
	// carries no debt. Zero: the charged cost stands.
	CostFromResponse Cost
	// Budgets are the rule's unit budgets (YAML budgets), for upstreams that limit input and
	// output tokens separately: each a limit with its own cost and reconciliation. A request
	// passes the rule only when every budget admits it. A rule with budgets has no Limit,
	// Period, Burst, Cost, CostFallback, CostFromResponse or Lease of its own, its Algorithm
	// is "" (the file's algorithm is the budgets' default), and it neither defers nor leases.
	// Empty: the rule is its own one limit.
	Budgets []Budget
	// CostOnCut is what a streamed answer cut short (the client gone, the upstream reset, the
	// rule's timeout) is charged (YAML cost_on_cut): CutEstimate (the default, also "") leaves the entry
	// charge standing; CutDeltas charges what its events said so far (cost.Stream.Seen). Only
	// with CostFromResponse.
	CostOnCut CutCharge
	// CutOnDebt ends a streamed answer cleanly once what its events have said so far
	// (cost.Stream.Seen) is more than CutOnDebt units above its entry charge (YAML
	// cut_on_debt); 0: never. Only with CostFromResponse.
	CutOnDebt int64
}

// CutCharge says what a streamed answer cut short is charged (cost_on_cut).
type CutCharge string

const (
	// CutEstimate leaves the entry charge standing.
	CutEstimate CutCharge = "estimate"
	// CutDeltas charges the usage values read so far (a leaf never read counting 0) plus one
	// unit per event that carried none.
	CutDeltas CutCharge = "deltas"
)

// DefaultMaxWaitingPerKey caps the default deferral budget of a rule (WaitingPerKey).
const DefaultMaxWaitingPerKey = 1000

// WaitingPerKey is the rule's deferral budget into queue q: MaxWaitingPerKey when set, else a
// tenth of q's max_depth, at least 1 and at most DefaultMaxWaitingPerKey, so that ten keys
// at least share a queue before any is refused.
func (r Rule) WaitingPerKey(q *Queue) int64 {
	if r.MaxWaitingPerKey > 0 {
		return r.MaxWaitingPerKey
	}
	return min(max(q.MaxDepth/10, 1), DefaultMaxWaitingPerKey)
}

// LimitSpec returns the rule's limit as the limiters take it: with Refunds when the rule
// reconciles its charges (cost_from_response), so that a token bucket's refunds are exact.
func (r Rule) LimitSpec() limit.Limit {
	return limit.Limit{Algorithm: r.Algorithm, Limit: r.Limit, Period: r.Period, Burst: r.Burst, OnReset: r.OnStoreReset,
		Refunds: r.CostFromResponse.IsSet()}
}

// HasLimit reports whether the rule carries a limit: always for ActionLimit, and for
// ActionEnqueue when an algorithm is set. A concurrency rule's limit is in flight, not per
// period (Concurrency).
func (r Rule) HasLimit() bool { return r.Algorithm != "" }

// Concurrency reports whether the rule caps requests in flight (algorithm: concurrency): at
// most Limit of a key forwarded at once, each for at most Timeout.
func (r Rule) Concurrency() bool { return r.Algorithm == AlgorithmConcurrency }

// KeyParts returns the rule's key: Key, or the default [ip] (the client address) when it is
// empty, as in a hand-built Rule (one from Load or Parse always has it).
func (r Rule) KeyParts() []KeyPart {
	if len(r.Key) == 0 {
		return []KeyPart{{Kind: KeyIP}}
	}
	return r.Key
}

// TimeoutOrDefault returns Timeout, or DefaultRuleTimeout when it is 0, as in a hand-built
// concurrency Rule (one from Load or Parse always has it).
func (r Rule) TimeoutOrDefault() time.Duration {
	if r.Timeout == 0 {
		return DefaultRuleTimeout
	}
	return r.Timeout
}

// StoreErrorMode returns the rule's store-error mode: its own when set, else global, else
// StoreErrorAllow.
func (r Rule) StoreErrorMode(global StoreErrorMode) StoreErrorMode {
	switch {
	case r.OnStoreError != "":
		return r.OnStoreError
	case global != "":
		return global
	default:
		return DefaultOnStoreError
	}
}

// OnLimit is what happens to a request over a rule's limit.
type OnLimit string

// The on_limit values.
const (
	// OnLimitReject answers 429 with Retry-After.
	OnLimitReject OnLimit = "reject"
	// OnLimitEnqueue defers the request to the rule's queue and answers 202.
	OnLimitEnqueue OnLimit = "enqueue"
)

// Action is what a rule does with every matching request.
type Action string

// The action values.
const (
	// ActionLimit decides each request with the rule's algorithm; this is the default.
	ActionLimit Action = "limit"
	// ActionEnqueue sends every matching request to the rule's queue: the pure leaky-bucket
	// shape, where the queue's rate is the limit.
	ActionEnqueue Action = "enqueue"
)

// Match selects requests by method and path.
type Match struct {
	// Methods are upper-case HTTP methods; empty matches any method. The ingress upper-cases
	// a request's method before it matches and forwards it, so "post" is POST to both.
	Methods []string
	// Path is an exact path ("/api/orders"), or a prefix with a trailing "/*" ("/api/*"
	// matches "/api" and everything under "/api/"); "/*" and "" match every path. The
	// request path is compared as given: callers pass it cleaned and unescaped as they
	// route it.
	Path string
	// CaseInsensitive matches Path without regard to ASCII case (YAML
	// match.case_insensitive), for upstreams that route "/API/x" as "/api/x".
	CaseInsensitive bool
}

// Matches reports whether a request with this method and path is selected by m. It selects
// what upstreams route alike: HEAD when Methods has GET, and an exact Path with or without a
// trailing slash ("/api/orders" matches "/api/orders/" and the other way round).
func (m Match) Matches(method, path string) bool {
	if len(m.Methods) > 0 && !slices.Contains(m.Methods, method) &&
		(method != "HEAD" || !slices.Contains(m.Methods, "GET")) {
		return false
	}
	if m.CaseInsensitive {
		m.Path, path = strings.ToLower(m.Path), strings.ToLower(path)
	}
	prefix, ok := strings.CutSuffix(m.Path, "/*")
	noSlash := func(p string) string {
		if len(p) > 1 {
			return strings.TrimSuffix(p, "/")
		}
		return p
	}
	switch {
	case m.Path == "":
		return true
	case !ok:
		return noSlash(path) == noSlash(m.Path)
	case prefix == "":
		return true
	default:
		return path == prefix || strings.HasPrefix(path, prefix+"/")
	}
}

// KeyKind is the kind of one part of a limiter key.
type KeyKind string

// The key part kinds, as written in the file (with ":NAME" or ":TEXT" where they take one).
const (
	KeyIP     KeyKind = "ip"     // the client address, after trusted proxies
	KeyHeader KeyKind = "header" // header:NAME, the value of a request header
	KeyQuery  KeyKind = "query"  // query:NAME, the value of a query parameter
	KeyMethod KeyKind = "method" // the request method
	KeyPath   KeyKind = "path"   // the request path
	KeyConst  KeyKind = "const"  // const:TEXT, a fixed text: one key shared by all requests
)

// KeyPart is one part of a limiter key.
type KeyPart struct {
	Kind KeyKind
	// Name is the header name (canonical form, as textproto.CanonicalMIMEHeaderKey gives
	// it) for KeyHeader, the parameter name for KeyQuery, the text for KeyConst, and ""
	// for the other kinds.
	Name string
}

// String returns the part as written in the file: "ip", "header:X-Api-Key".
func (p KeyPart) String() string {
	if p.Name == "" {
		return string(p.Kind)
	}
	return string(p.Kind) + ":" + p.Name
}
