package config

import (
	"fmt"
	"net"
	"net/netip"
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
	// DefaultSharedStreams is nats.shared_streams when the file does not set it (and sets no
	// nats.store_budget, which keeps the default of a stream per queue): the plain queues share
	// 16 streams, so that thousands of queues start in seconds and cost an idle NATS server
	// next to nothing (docs/scaling.md, docs/design/scale.md).
	DefaultSharedStreams  = 16
	DefaultReadTimeout    = 30 * time.Second
	DefaultReadAheadBytes = 64 << 20
	DefaultIPv6Prefix     = 64

	DefaultMaxDepth     = 100000
	DefaultMaxBodyBytes = 1 << 20
	// DefaultMaxBytes is a queue's max_bytes when neither the queue nor nats.store_budget
	// sets one: 0, no bound of the stream's own. JetStream reserves a stream's MaxBytes on the
	// server's store when the stream is created (only when it is set), so a default of 256 MiB
	// fitted ~300 queues on a stock server; unset, a queue reserves nothing and is bounded by
	// max_depth and by the server's store limit, which refuses every write once the streams
	// together reach it (docs/scaling.md).
	DefaultMaxBytes     = 0
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
	// Region names this deployment's region (YAML region); "" (the default): one region.
	Region string
	// Regions is how the regions share global budgets (YAML regions); nil with Region "".
	Regions *Regions
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
	// ReadAheadBytes bounds the bytes of request bodies the ingress holds, across all
	// requests at once, read ahead to find a rule's cost in them (cost: json:…, or body_bytes
	// without a Content-Length): each such request holds up to 1 MiB + 1 byte while its rules
	// decide. A request that finds the bound held is charged its rule's cost fallback without
	// its body being read (YAML read_ahead_bytes, 1 MiB + 1 to 16 GiB). Default 64 MiB.
	ReadAheadBytes int64
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
	// FormatSuffixes are the format suffixes of a path that an upstream routes as the path
	// itself (YAML format_suffixes, such as ".json"): a rule on "/api/orders" also matches
	// "/api/orders.json", and one on "/api/*" also "/api.json", so a client cannot step around
	// a rule by naming its format. Default DefaultFormatSuffixes; [] turns it off. Each starts
	// with "." followed by 1 to 15 letters or digits.
	FormatSuffixes []string
	// IDSecret keys the ids of jobs with an Idempotency-Key (YAML id_secret, env
	// SLUICE_ID_SECRET), at least 16 bytes. "": a secret generated once and kept in JetStream.
	IDSecret string
	// Tracing sends OpenTelemetry traces of requests and deliveries to a collector (YAML
	// tracing). Nil: tracing is off. Read at start-up; a reload names it among the keys that
	// apply at the next restart. docs/tracing.md lists the spans.
	Tracing *Tracing
	// Worker is how a worker process sends its deliveries (YAML worker).
	Worker Worker
	// Queues are the deferred-work queues, in file order; names are unique.
	Queues []Queue
	// Rules are the rate-limit rules, in file order; names are unique.
	Rules []Rule
	// RLSListen is the host:port of the ingress's Envoy rate-limit service, gRPC
	// envoy.service.ratelimit.v3.RateLimitService (YAML rls_listen). "": not served. It needs
	// RLS.
	RLSListen string
	// RLS configures that service (YAML rls); nil exactly when RLSListen is "".
	RLS *RLS
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

// StoreTimeoutOrDefault returns StoreTimeout, or DefaultStoreTimeout when it is not positive,
// as in a hand-built Config (one from Load or Parse always has it).
func (c *Config) StoreTimeoutOrDefault() time.Duration {
	if c.StoreTimeout <= 0 {
		return DefaultStoreTimeout
	}
	return c.StoreTimeout
}

// Redis is the shared limiter store.
type Redis struct {
	// URL is a redis:// or rediss:// URL, with user, password and database number as
	// go-redis's ParseURL accepts them. Required.
	URL string
}

// Tracing is the tracing section.
type Tracing struct {
	// OTLP is the OTLP/HTTP collector's base URL, http or https (YAML tracing.otlp), such as
	// http://127.0.0.1:4318: spans are posted to its path with /v1/traces appended, unless the
	// path already ends so. Required in a tracing section.
	OTLP string
	// SampleRatio is the share, 0 to 1, of the traces that start at Sluice (requests without a
	// traceparent) that are sampled (YAML tracing.sample_ratio). A request with a traceparent
	// follows its sampled flag, and a delivery its job's. Default 1.
	SampleRatio float64
}

// DefaultSampleRatio samples every trace that starts at Sluice.
const DefaultSampleRatio = 1.0

// NATS is an external NATS server or cluster with JetStream.
type NATS struct {
	// URL is one server URL or several separated by commas (nats://, tls://, ws://, wss://,
	// or a bare host:port). Required.
	URL string
	// Replicas is the replica count of the streams Sluice creates, 1 to 5. Default 1. Above 1
	// the NATS servers must run JetStream as a cluster of at least that many.
	Replicas int
	// StoreBudget (YAML store_budget, bytes) is what the queues' streams may reserve together
	// on a NATS server's store: every queue without its own max_bytes gets an equal share of
	// what the queues with one leave (a fair queue's backlog and a priority queue's levels are
	// streams of their own, each with the queue's max_bytes). 0, the default: no budget, and
	// such queues reserve nothing (DefaultMaxBytes).
	StoreBudget int64
	// SharedStreams (YAML shared_streams) is how many shared job streams hold the jobs of the
	// queues that need nothing beyond a plain job stream: not fair, no priorities, no
	// max_bytes of their own (queue.Shareable). Each such queue then costs the NATS server no
	// stream and, while idle, no consumer and no pull (docs/scaling.md). 0 to
	// queue.MaxSharedStreams; 0: every queue has a stream of its own. Default
	// DefaultSharedStreams, or 0 when the file sets StoreBudget and not shared_streams (the
	// budget gives every queue a max_bytes of its own); both set, with shared_streams above 0,
	// is refused. Read at start only; changing it (or a queue becoming shareable or not) moves
	// the queues' new jobs, and the workers drain what waits where they were, then remove it
	// (docs/scaling.md, "Changing it").
	SharedStreams int
	// JetStreamDomain (YAML jetstream_domain) is the JetStream domain that holds the queues,
	// reached through the servers of URL: every JetStream context of the processes and of
	// `sluice check` is made for it (jetstream.NewWithDomain), so their API requests go to
	// "$JS.<domain>.API.>", as a client of a leaf node whose own JetStream is in another
	// domain (or has none) must send them to reach the hub's. Empty, the default: the
	// JetStream of the servers connected to ("$JS.API.>"). A NATS subject token: no dots,
	// wildcards or white space (as nats-server requires of jetstream { domain }). Read at
	// start only.
	JetStreamDomain string
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
