package config

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/limit"
	"github.com/sluice-rl/sluice/queue"
)

// Defaults, applied to keys absent from the file — once, here: the worker takes complete
// values, and where the public queue package has a default of its own for a zero field, the
// file's default is that constant.
const (
	DefaultListen          = "127.0.0.1:8080"
	DefaultAdminListen     = "127.0.0.1:9090"
	DefaultDataDir         = "./data"
	DefaultOnStoreError    = StoreErrorAllow
	DefaultStoreTimeout    = 50 * time.Millisecond
	DefaultShutdownTimeout = 10 * time.Second
	DefaultJobRetention    = queue.DefaultStatusTTL
	DefaultMaxHeaderBytes  = 64 << 10
	DefaultNATSReplicas    = 1
	DefaultReadTimeout     = 30 * time.Second
	DefaultIPv6Prefix      = 64

	DefaultMaxDepth     = 100000
	DefaultMaxBodyBytes = 1 << 20
	// DefaultMaxBytes bounds a queue's stream: 256 MiB. JetStream reserves it on the server's
	// store when the stream is created, so the queues' max_bytes together (times
	// nats.replicas) must fit in what the NATS servers may store.
	DefaultMaxBytes     = 256 << 20
	DefaultTargetMethod = "POST"
	DefaultMaxAttempts  = 8
	// A queue's delivery backoff. The worker always passes these (or the file's) to retry;
	// retry's own zero-Policy defaults (500ms to 30s) are the client SDK's, for calls a
	// program waits on, not for deliveries that may wait minutes.
	DefaultBackoffInitial  = time.Second
	DefaultBackoffMax      = 5 * time.Minute
	DefaultTimeout         = 10 * time.Second
	DefaultDedupeWindow    = queue.DefaultDedupeWindow
	DefaultMaxDelay        = 30 * 24 * time.Hour
	DefaultAckWait         = queue.DefaultAckWait
	DefaultConcurrency     = 4
	DefaultMaxPauseRetries = 20
	// DefaultPause is how long a queue pauses after an upstream 429 or 503 that named no wait
	// (no Retry-After, RateLimit or X-RateLimit-Reset header). Not a key of the file.
	DefaultPause = time.Second

	// DefaultMatchPath is the path of a rule without match.path: every path.
	DefaultMatchPath = "/*"

	// DefaultRuleTimeout is the timeout of an algorithm: concurrency rule: the longest a
	// request it caps may take at the upstream, answer body included.
	DefaultRuleTimeout = 60 * time.Second
)

// AlgorithmConcurrency is the algorithm of a rule that caps the requests of a key in flight to
// the upstream at once (nginx limit_conn) rather than their rate. It is not a limit.Algorithm
// the limiters know: the ingress holds its places in an inflight.Store.
const AlgorithmConcurrency limit.Algorithm = "concurrency"

// Config is one configuration file, decoded, completed with defaults and validated.
type Config struct {
	// Path is the file the config was loaded from, as given to Load or Parse. It is not a
	// key of the file.
	Path string
	// source is the file content the config was parsed from; a Watcher given this config as
	// Current reloads when the file no longer holds it.
	source []byte
	// Listen is the public listener's host:port (YAML listen, env SLUICE_LISTEN).
	// Default "127.0.0.1:8080".
	Listen string
	// AdminListen is the admin listener's host:port: metrics, health, the admin API (YAML
	// admin_listen, env SLUICE_ADMIN_LISTEN). Default "127.0.0.1:9090".
	AdminListen string
	// Upstream is the absolute http or https URL that allowed and deferred requests are
	// forwarded to. Required when any rule is defined; "" otherwise.
	Upstream string
	// TrustedProxies are the peers whose X-Forwarded-For and Forwarded headers are believed
	// (YAML trusted_proxies: a list of CIDRs or bare IPs; a bare IP is a /32 or /128).
	// Prefixes are masked and IPv4-mapped IPv6 addresses unmapped. Empty: trust no one.
	TrustedProxies []netip.Prefix
	// DataDir is where the embedded NATS server stores its streams (YAML data_dir).
	// Default "./data".
	DataDir string
	// DemoUpstream, when set, is a host:port on which the process also serves the quickstart's
	// tiny demo API (YAML demo_upstream), so that one command shows the whole flow. For trying
	// Sluice out only; "" (the default) serves nothing.
	DemoUpstream string
	// Redis is where limiter state and leak schedules are shared between processes. Nil: in
	// memory, for a single process only. SLUICE_REDIS_URL creates or overrides it.
	Redis *Redis
	// NATS is the JetStream cluster that holds the queues. Nil: an embedded server.
	// SLUICE_NATS_URL creates or overrides it.
	NATS *NATS
	// OnStoreError says what a rule decides when the limiter store fails (YAML
	// on_store_error). Rules may override it. Default StoreErrorAllow.
	OnStoreError StoreErrorMode
	// Shadow puts every rule in shadow mode: it counts and reports, never blocks or defers.
	Shadow bool
	// LogDecisions logs every rule's decision (rule, a hash of the key, outcome, the answer's
	// status) at info level, for debugging limits (YAML log_decisions). Default false.
	LogDecisions bool
	// StoreTimeout bounds each limiter-store call (YAML store_timeout). Default 50ms.
	StoreTimeout time.Duration
	// ShutdownTimeout bounds a graceful shutdown (YAML shutdown_timeout). Default 10s.
	ShutdownTimeout time.Duration
	// JobRetention is how long the status of a job is kept (YAML job_retention). Default 24h.
	JobRetention time.Duration
	// MaxHeaderBytes bounds the request header size on the public listener, in bytes (YAML
	// max_header_bytes). Default 64 KiB.
	MaxHeaderBytes int
	// ReadTimeout bounds how long a request's body may take to arrive on the public listener
	// (YAML read_timeout); a stalled body is cut off. Default 30s.
	ReadTimeout time.Duration
	// IPv6Prefix is the prefix length by which an "ip" key part keys IPv6 clients (YAML
	// ipv6_prefix), 32 to 128: one client usually owns a whole /64. Default 64.
	IPv6Prefix int
	// AdminToken guards the admin API's writes (YAML admin_token, env SLUICE_ADMIN_TOKEN):
	// they need "Authorization: Bearer <token>". "": writes only from loopback peers. At least
	// 16 characters, and not a placeholder such as "change-me".
	AdminToken string
	// AdminHosts are the names, besides loopback ones and the listener's own address, that a
	// request to the admin listener may give as its Host (YAML admin_hosts: "host" for any
	// port, or "host:port"), lowercased, IPv6 hosts in brackets. A request for any other Host
	// is refused, so that a DNS-rebinding page cannot reach the admin API. Empty: none.
	AdminHosts []string
	// IDSecret keys the ids of jobs with an Idempotency-Key (YAML id_secret, env
	// SLUICE_ID_SECRET), at least 16 bytes. "": a secret generated once and kept in JetStream.
	IDSecret string
	// Queues are the deferred-work queues, in file order; names are unique.
	Queues []Queue
	// Rules are the rate-limit rules, in file order; names are unique.
	Rules []Rule
}

// Queue returns the queue named name, and whether there is one. The pointer points into
// c.Queues.
func (c *Config) Queue(name string) (*Queue, bool) {
	for i := range c.Queues {
		if c.Queues[i].Name == name {
			return &c.Queues[i], true
		}
	}
	return nil, false
}

// Redis is the shared limiter store.
type Redis struct {
	// URL is a redis:// or rediss:// URL, with user, password and database number as
	// go-redis's ParseURL accepts them. Required.
	URL string
}

// NATS is an external NATS server or cluster with JetStream.
type NATS struct {
	// URL is one server URL or several separated by commas (nats://, tls://, ws://, wss://,
	// or a bare host:port). Required.
	URL string
	// Replicas is the replica count of the streams Sluice creates, 1 to 5. Default 1.
	Replicas int
}

// StoreErrorMode says what a rule decides when the limiter store cannot be reached.
type StoreErrorMode string

// The store-error modes, as written in the file.
const (
	// StoreErrorAllow fails open: the request is admitted, and counted as a fail-open decision.
	StoreErrorAllow StoreErrorMode = "allow"
	// StoreErrorDeny fails closed: the request is refused with 503.
	StoreErrorDeny StoreErrorMode = "deny"
)

// Valid reports whether m is one of the modes.
func (m StoreErrorMode) Valid() bool { return m == StoreErrorAllow || m == StoreErrorDeny }

// Queue is a queue of deferred work that workers drain at a fixed global rate.
type Queue struct {
	// Name is 1 to 64 of A-Z, a-z, 0-9, "_" and "-"; unique among queues. Required.
	Name string
	// Rate is the leak rate, shared by all workers together. Required.
	Rate Rate
	// Burst is how many deliveries may go out at once after an idle spell, on top of the
	// steady rate. Default 0: deliveries are strictly Rate.Interval() apart.
	Burst int64
	// MaxDepth is the most jobs the queue holds; beyond it new jobs are refused with 429
	// (YAML max_depth). Default 100000.
	MaxDepth int64
	// MaxBodyBytes bounds the body of a job, in bytes (YAML max_body_bytes). Default 1 MiB.
	MaxBodyBytes int64
	// MaxBytes bounds the bytes the queue's stream holds, JetStream's own MaxBytes (YAML
	// max_bytes), >= MaxBodyBytes; beyond it new jobs are refused with 429, as beyond
	// MaxDepth. Default 256 MiB.
	MaxBytes int64
	// Target is where directly submitted jobs are delivered (YAML "POST http://host/path";
	// the method is optional and defaults to POST). Nil: the queue has no target of its own
	// and serves only the deferred requests of rules, which go to Config.Upstream.
	Target *Target
	// MaxAttempts is how many delivery attempts a job gets before it is dead-lettered (YAML
	// max_attempts), >= 1. Default 8.
	MaxAttempts int
	// Backoff spaces the retries of a failed delivery. Default {Initial: 1s, Max: 5m}.
	Backoff Backoff
	// Timeout bounds one delivery attempt. Default 10s.
	Timeout time.Duration
	// DedupeWindow is how long an Idempotency-Key maps to its job (YAML dedupe_window).
	// Default 24h.
	DedupeWindow time.Duration
	// AckWait is how long a job held by a worker that died waits before JetStream hands it to
	// another (YAML ack_wait), >= 100ms. Live workers keep the jobs they hold alive, so it can
	// be short; it is also how long the jobs a stopped embedded server held take to come back
	// after a restart of the quickstart. Default 30s.
	AckWait time.Duration
	// MaxDelay is how far ahead a job may be scheduled (Sluice-Delay, Sluice-Not-Before; YAML
	// max_delay); a job scheduled further ahead is refused with 400. Default 30 days (as
	// Cloud Tasks), at most 366 days.
	MaxDelay time.Duration
	// Priorities lets the queue's jobs carry Sluice-Priority high or low (YAML priorities):
	// a plain queue then keeps a stream and a consumer per level beside its own, which cost
	// the NATS servers; without it, such a submission is refused with 400. A fair queue
	// keeps a job's priority without levels.
	Priorities bool
	// Concurrency is how many deliveries of this queue one worker process has in flight.
	// Default 4.
	Concurrency int
	// MaxPauseRetries is how many times a job is retried after an upstream 429 or 503
	// without spending an attempt (YAML max_pause_retries), >= 0. Default 20.
	MaxPauseRetries int
	// Tenant are the key parts, as a rule's key, that name who a job belongs to (YAML
	// tenant): they scope its Idempotency-Key and who may read its status. Empty: the queue
	// has one tenant.
	Tenant []KeyPart
	// Adaptive makes Rate the ceiling of a rate the workers learn from the upstream's
	// answers: lower on 429/503 and low remaining quota, back up while it answers 2xx (YAML
	// adaptive). Default false.
	Adaptive bool
	// MinRate is the floor of the learned rate (YAML min_rate). Default: Rate/100, at least
	// 1/s (or Rate itself when that is lower).
	MinRate Rate
	// Fair shares the queue's rate among the tenants that have jobs waiting, in weighted
	// round robin, instead of delivering in arrival order (YAML fair). Needs Tenant.
	Fair bool
	// Weights maps a tenant's value (its key parts' values, joined by NUL bytes when there
	// are several) to its weight in the round robin, > 0 and <= 1000; default 1.
	Weights map[string]float64
	// TenantRate caps the deliveries of any one tenant of a fair queue (YAML tenant_rate);
	// zero: no cap.
	TenantRate Rate
	// MaxInFlight caps the deliveries of the queue in flight at once across every worker
	// process (YAML max_in_flight): a delivery holds its place from the start of its request
	// until its answer or timeout. Zero: no cap but each worker's Concurrency.
	MaxInFlight int64
	// TenantInFlight caps the deliveries of any one tenant of a fair queue in flight at once
	// across every worker process (YAML tenant_in_flight). Zero: no cap.
	TenantInFlight int64
	// PauseScope is what an upstream 429 or 503 pauses (YAML pause_scope): PauseQueue (the
	// default) or PauseTenant, the job's tenant only, on a fair queue.
	PauseScope PauseScope
	// TenantMaxDepth is the most jobs one tenant of a fair queue may hold waiting in its
	// backlog (YAML tenant_max_depth), 1 to max_depth: beyond it that tenant's new jobs are
	// refused with 429 while other tenants' are accepted. 0: no bound but MaxDepth.
	TenantMaxDepth int64
	// TenantSettings are single tenants' own settings on a fair queue, by the tenant's value
	// as Weights names it (YAML tenant_settings); an operator's (the admin API's) replace them.
	TenantSettings map[string]TenantSettings
	// Cost is what one job costs in the queue's units (YAML cost), read when the job is
	// accepted; the default costs 1. It needs CostRate.
	Cost Cost
	// CostFallback is the cost of a job whose cost cannot be read (YAML cost_fallback);
	// 0: CostCapacity (see Fallback).
	CostFallback int64
	// CostRate is the units per period the queue delivers, shared by every worker, beside
	// Rate (YAML cost_rate): a job waits for both. Zero: no unit budget.
	CostRate Rate
	// CostBurst is how many units may go at once after idleness (YAML cost_burst); 0: a job's
	// units are spaced at CostRate from the previous job's.
	CostBurst int64
	// CostFromResponse reads a delivery's true cost from the upstream's answer (YAML
	// cost_from_response): the difference from Cost is charged or refunded to the queue's
	// unit schedule. Zero: the charged cost stands.
	CostFromResponse Cost
}

// TenantSettings are one tenant's own settings; a zero field keeps the queue's.
type TenantSettings struct {
	// Weight is its weight in the round robin, > 0 and <= 1000 (as Weights).
	Weight float64
	// Rate caps its deliveries, in place of tenant_rate.
	Rate Rate
	// InFlight caps its deliveries in flight, in place of tenant_in_flight.
	InFlight int64
}

// PauseScope is what an upstream's 429 or 503 (and its Retry-After) pauses.
type PauseScope string

// The pause scopes.
const (
	// PauseQueue pauses the whole queue, on every worker.
	PauseQueue PauseScope = "queue"
	// PauseTenant pauses the tenant of the job that was answered, on every worker; the other
	// tenants go on at the queue's rate. An operator's pause still pauses the whole queue.
	PauseTenant PauseScope = "tenant"
)

// TenantWeights returns Weights by tenant id: id (the queue layer's Queues.TenantID, keyed
// with the deployment's id secret) of each value. nil when Weights is empty; id is called only
// for Weights' values.
func (q *Queue) TenantWeights(id func(key []byte) string) map[string]float64 {
	if len(q.Weights) == 0 {
		return nil
	}
	out := make(map[string]float64, len(q.Weights))
	for v, w := range q.Weights {
		out[id([]byte(v))] = w
	}
	return out
}

// Target is the destination of a queue's directly submitted jobs.
type Target struct {
	// Method is an HTTP method, upper case. Default "POST".
	Method string
	// URL is an absolute http or https URL.
	URL string
}

// Backoff is an exponential backoff between delivery attempts.
type Backoff struct {
	// Initial is the delay before the first retry, > 0. Default 1s.
	Initial time.Duration
	// Max caps the delay, >= Initial. Default 5m.
	Max time.Duration
}

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
	// Shadow makes the rule count and report only, never block or defer.
	Shadow bool
	// OnStoreError overrides Config.OnStoreError for this rule (YAML on_store_error).
	// "": inherit the global mode; see StoreErrorMode.
	OnStoreError StoreErrorMode
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
	// Only rules with a limit per period have one; a request whose cost exceeds the limit's
	// capacity is refused (422), never charged forever.
	Cost Cost
	// CostFallback is the cost of a request whose cost cannot be read (YAML cost_fallback);
	// 0: the limit's capacity (see Fallback).
	CostFallback int64
	// CostFromResponse reads a forwarded request's true cost from the upstream's answer (YAML
	// cost_from_response): the difference from the charged cost is charged or refunded to the
	// request's key. Zero: the charged cost stands.
	CostFromResponse Cost
}

// LimitSpec returns the rule's limit as the limiters take it.
func (r Rule) LimitSpec() limit.Limit {
	return limit.Limit{Algorithm: r.Algorithm, Limit: r.Limit, Period: r.Period, Burst: r.Burst}
}

// HasLimit reports whether the rule carries a limit: always for ActionLimit, and for
// ActionEnqueue when an algorithm is set. A concurrency rule's limit is in flight, not per
// period (Concurrency).
func (r Rule) HasLimit() bool { return r.Algorithm != "" }

// Concurrency reports whether the rule caps requests in flight (algorithm: concurrency): at
// most Limit of a key forwarded at once, each for at most Timeout.
func (r Rule) Concurrency() bool { return r.Algorithm == AlgorithmConcurrency }

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

// IDSecretBytes returns IDSecret as the bytes queue.Options.IDSecret takes: nil when it is
// empty, so that the queue layer uses the secret kept in JetStream.
func (c *Config) IDSecretBytes() []byte {
	if c.IDSecret == "" {
		return nil
	}
	return []byte(c.IDSecret)
}

// RedisSeeds is a redis.url that lists several host:port seeds separated by commas, the form
// that names a Redis Cluster: "redis://[user:password@]host:port,host:port,..." (or rediss://,
// or the bare "host:port,host:port").
type RedisSeeds struct {
	TLS            bool
	User, Password string
	Addrs          []string
}

// ParseRedisSeeds parses a cluster redis.url; ok is false for a URL with a single host, which
// names one server (go-redis's ParseURL reads it).
func ParseRedisSeeds(s string) (seeds RedisSeeds, ok bool, err error) {
	if !strings.Contains(s, ",") {
		return RedisSeeds{}, false, nil
	}
	rest := s
	if scheme, after, found := strings.Cut(s, "://"); found {
		switch scheme {
		case "redis":
		case "rediss":
			seeds.TLS = true
		default:
			return RedisSeeds{}, true, fmt.Errorf("scheme %q is not redis or rediss", scheme)
		}
		rest = after
	}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		user, pass, _ := strings.Cut(rest[:at], ":")
		seeds.User, seeds.Password, rest = user, pass, rest[at+1:]
	}
	rest = strings.TrimSuffix(rest, "/")
	for _, a := range strings.Split(rest, ",") {
		a = strings.TrimSpace(a)
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" || port == "" {
			return RedisSeeds{}, true, fmt.Errorf("seed %d: want host:port", len(seeds.Addrs)+1)
		}
		seeds.Addrs = append(seeds.Addrs, a)
	}
	return seeds, true, nil
}
