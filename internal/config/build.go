package config

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/textproto"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/limit"
	"github.com/sluice-rl/sluice/retry"
)

// builder turns the raw file into a Config, filling in defaults and reporting every problem.
type builder struct {
	p *problems
	// env maps the fields set from the environment to their variable.
	env map[string]string
}

// build converts raw into a Config. The Config is complete but only valid when p has
// recorded no problem.
func build(p *problems, path string, raw *rawConfig, getenv func(string) string) *Config {
	b := &builder{p: p, env: map[string]string{}}
	b.applyEnv(raw, getenv)

	c := &Config{Path: path}
	b.network(c, raw)
	b.stores(c, raw)
	b.process(c, raw)
	queueAt := b.queues(c, raw.Queues)
	b.rules(c, raw.Rules, queueAt)
	if len(c.Rules) > 0 && raw.Upstream == nil {
		p.add("", "upstream", "upstream is required when rules are defined")
	}
	return c
}

// network reads where the process listens and forwards: listen, admin_listen, upstream,
// trusted_proxies, data_dir and demo_upstream.
func (b *builder) network(c *Config, raw *rawConfig) {
	c.Listen = b.addr("listen", raw.Listen, DefaultListen)
	c.AdminListen = b.addr("admin_listen", raw.AdminListen, DefaultAdminListen)
	c.Upstream = b.httpURL("", "upstream", raw.Upstream)
	for i, s := range b.list("", "trusted_proxies", raw.TrustedProxies) {
		if pfx, ok := parseProxy(s); ok {
			c.TrustedProxies = append(c.TrustedProxies, pfx)
		} else if s != "" || raw.TrustedProxies.items[i].shape == "" {
			b.p.addf("", fmt.Sprintf("trusted_proxies[%d]", i), "trusted_proxies[%d]: invalid CIDR or IP %q", i, s)
		}
	}
	c.DataDir = b.text("", "data_dir", raw.DataDir, DefaultDataDir)
	if c.DataDir == "" {
		b.p.add("", "data_dir", "data_dir must not be empty")
	}
	if raw.DemoUpstream != nil {
		c.DemoUpstream = b.addr("demo_upstream", raw.DemoUpstream, "")
	}
}

// stores reads the redis and nats sections.
func (b *builder) stores(c *Config, raw *rawConfig) {
	if raw.Redis != nil {
		c.Redis = &Redis{URL: b.redisURL(raw.Redis.URL)}
	}
	if raw.NATS != nil {
		c.NATS = &NATS{
			URL:      b.natsURL(raw.NATS.URL),
			Replicas: int(b.integer("", "nats.replicas", raw.NATS.Replicas, DefaultNATSReplicas, strconv.IntSize)),
		}
		if c.NATS.Replicas < 1 || c.NATS.Replicas > 5 {
			b.p.add("", "nats.replicas", "nats.replicas must be between 1 and 5")
		}
	}
}

// process reads the keys that apply to the whole process: store-error mode, shadow, timeouts,
// sizes, the admin token and the id secret.
func (b *builder) process(c *Config, raw *rawConfig) {
	c.OnStoreError = b.storeErrorMode("", raw.OnStoreError, DefaultOnStoreError)
	c.Shadow = b.boolean("", "shadow", raw.Shadow)
	c.LogDecisions = b.boolean("", "log_decisions", raw.LogDecisions)
	c.StoreTimeout = b.positiveDuration("", "store_timeout", raw.StoreTimeout, DefaultStoreTimeout)
	c.ShutdownTimeout = b.positiveDuration("", "shutdown_timeout", raw.ShutdownTimeout, DefaultShutdownTimeout)
	c.JobRetention = b.positiveDuration("", "job_retention", raw.JobRetention, DefaultJobRetention)
	c.MaxHeaderBytes = int(b.integer("", "max_header_bytes", raw.MaxHeaderBytes, DefaultMaxHeaderBytes, strconv.IntSize))
	b.bound("", "max_header_bytes", int64(c.MaxHeaderBytes), 1, 16<<20)
	c.ReadTimeout = b.positiveDuration("", "read_timeout", raw.ReadTimeout, DefaultReadTimeout)
	c.IPv6Prefix = int(b.integer("", "ipv6_prefix", raw.IPv6Prefix, DefaultIPv6Prefix, 16))
	b.bound("", "ipv6_prefix", int64(c.IPv6Prefix), 32, 128)
	c.AdminToken = b.text("", "admin_token", raw.AdminToken, "")
	b.adminToken(c.AdminToken)
	for i, s := range b.list("", "admin_hosts", raw.AdminHosts) {
		if h, ok := parseAdminHost(s); ok {
			c.AdminHosts = append(c.AdminHosts, h)
		} else {
			b.p.addf("", fmt.Sprintf("admin_hosts[%d]", i), "admin_hosts[%d]: want a host name or IP, optionally with :port, got %q", i, s)
		}
	}
	c.IDSecret = b.text("", "id_secret", raw.IDSecret, "")
	if c.IDSecret != "" && len(c.IDSecret) < 16 {
		b.p.add("", "id_secret", "id_secret must be at least 16 bytes long")
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"store_timeout", c.StoreTimeout}, {"shutdown_timeout", c.ShutdownTimeout},
		{"job_retention", c.JobRetention}, {"read_timeout", c.ReadTimeout}} {
		b.boundDuration("", d.field, d.v, maxDuration)
	}
}

// minAdminToken is the shortest admin token accepted, in characters.
const minAdminToken = 16

// adminToken reports a token that is short or a placeholder; "" (no token) is valid.
func (b *builder) adminToken(tok string) {
	field := b.label("admin_token")
	lower := strings.ToLower(tok)
	for _, ph := range []string{"change-me", "changeme", "change_me"} {
		if strings.Contains(lower, ph) {
			b.p.addf("", "admin_token", "%s: %q is a placeholder; set a random token of at least %d characters (such as `openssl rand -hex 16`)", field, tok, minAdminToken)
			return
		}
	}
	if n := len([]rune(tok)); n > 0 && n < minAdminToken {
		b.p.addf("", "admin_token", "%s must be at least %d characters long, got %d", field, minAdminToken, n)
	}
}

// adminHostName is a DNS name as admin_hosts may list it.
var adminHostName = regexp.MustCompile(`^[a-z0-9_]([a-z0-9_-]*[a-z0-9])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9])?)*$`)

// parseAdminHost returns an admin_hosts item ("host" or "host:port", host a DNS name or an
// IP) lowercased, with an IPv6 host in brackets; false when it is neither.
func parseAdminHost(s string) (string, bool) {
	s = strings.ToLower(strings.TrimSpace(s))
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		host, port = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"), ""
	} else if n, perr := strconv.Atoi(port); perr != nil || n < 1 || n > 65535 {
		return "", false
	}
	if a, err := netip.ParseAddr(host); err == nil {
		a = a.Unmap()
		host = a.String()
		if a.Is6() {
			host = "[" + host + "]"
		}
	} else if len(host) > 253 || !adminHostName.MatchString(host) {
		return "", false
	}
	if port != "" {
		return host + ":" + port, true
	}
	return host, true
}

// queues reads the queues, and returns the index of each name.
func (b *builder) queues(c *Config, raws []rawQueue) map[string]int {
	queueAt := map[string]int{}
	for i, rq := range raws {
		q := b.queue(i, rq)
		where := place("queues", i, q.Name)
		if j, dup := queueAt[q.Name]; dup && q.Name != "" {
			b.p.addf(where, "name", "name: duplicate of queues[%d]", j)
		} else {
			queueAt[q.Name] = i
		}
		c.Queues = append(c.Queues, q)
	}
	return queueAt
}

// rules reads the rules, whose queues must be among queueAt.
func (b *builder) rules(c *Config, raws []rawRule, queueAt map[string]int) {
	ruleAt := map[string]int{}
	for i, rr := range raws {
		r := b.rule(i, rr, queueAt)
		if j, dup := ruleAt[r.Name]; dup && r.Name != "" {
			b.p.addf(place("rules", i, r.Name), "name", "name: duplicate of rules[%d]", j)
		} else {
			ruleAt[r.Name] = i
		}
		c.Rules = append(c.Rules, r)
	}
}

// applyEnv writes the environment's overrides into raw.
func (b *builder) applyEnv(raw *rawConfig, getenv func(string) string) {
	set := func(name, field string, dst **scalar) {
		if v := getenv(name); v != "" {
			*dst = &scalar{text: v}
			b.env[field] = name
		}
	}
	if getenv(EnvRedisURL) != "" && raw.Redis == nil {
		raw.Redis = &rawRedis{}
	}
	if getenv(EnvNATSURL) != "" && raw.NATS == nil {
		raw.NATS = &rawNATS{}
	}
	if raw.Redis != nil {
		set(EnvRedisURL, "redis.url", &raw.Redis.URL)
	}
	if raw.NATS != nil {
		set(EnvNATSURL, "nats.url", &raw.NATS.URL)
	}
	set(EnvListen, "listen", &raw.Listen)
	set(EnvAdminListen, "admin_listen", &raw.AdminListen)
	set(EnvAdminToken, "admin_token", &raw.AdminToken)
	set(EnvIDSecret, "id_secret", &raw.IDSecret)
}

// Upper bounds of numbers in the file: far above any sane use, low enough that a typo cannot
// exhaust memory or overflow a computation.
const (
	maxConcurrency  = 10_000
	maxInFlight     = 1_000_000
	maxWeight       = 1000
	maxLease        = 10_000
	maxDepth        = 1 << 32
	maxBodyBytes    = 64 << 20 // the most NATS allows in one message
	maxAttempts     = 1000
	maxPauseRetries = 10_000
	maxBurst        = 1_000_000
	maxDuration     = 366 * 24 * time.Hour
	maxConns        = 100_000 // a concurrency rule's limit
	maxRuleTimeout  = 24 * time.Hour
)

// bound reports n outside [lo, hi] as a problem of field that names the bounds.
func (b *builder) bound(where, field string, n, lo, hi int64) {
	if n < lo || n > hi {
		b.p.addf(where, field, "%s must be between %d and %d, got %d", field, lo, hi, n)
	}
}

// boundDuration reports a duration longer than hi as a problem of field.
func (b *builder) boundDuration(where, field string, d, hi time.Duration) {
	if d > hi {
		b.p.addf(where, field, "%s must be at most %s, got %s", field, hi, d)
	}
}

// label names a top-level field in a message, with the variable it came from if any.
func (b *builder) label(field string) string {
	if v, ok := b.env[field]; ok {
		return fmt.Sprintf("%s (from %s)", field, v)
	}
	return field
}

// place names the index-th item of a section, with its name when it has one.
func place(section string, index int, name string) string {
	if name == "" {
		return fmt.Sprintf("%s[%d]", section, index)
	}
	return fmt.Sprintf("%s[%d] %q", section, index, name)
}

// text returns the value of a scalar field, or def when it is absent or not a single value
// (which it reports).
func (b *builder) text(where, field string, v *scalar, def string) string {
	if v == nil {
		return def
	}
	if v.shape != "" {
		b.p.addf(where, field, "%s: want a single value, not %s", field, v.shape)
		return def
	}
	return v.text
}

// list returns the values of a list field, reporting the items that are not single values;
// their value is "".
func (b *builder) list(where, field string, l stringList) []string {
	if l.shape != "" {
		b.p.addf(where, field, "%s: want a list, not %s", field, l.shape)
		return nil
	}
	out := make([]string, len(l.items))
	for i := range l.items {
		out[i] = b.text(where, fmt.Sprintf("%s[%d]", field, i), &l.items[i], "")
	}
	return out
}

func (b *builder) integer(where, field string, v *scalar, def int64, bits int) int64 {
	s := b.text(where, field, v, "")
	if s == "" && (v == nil || v.shape != "") {
		return def
	}
	n, err := strconv.ParseInt(s, 10, bits)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			b.p.addf(where, field, "%s: %s is out of range", field, s)
		} else {
			b.p.addf(where, field, "%s: want an integer, got %q", field, s)
		}
		return def
	}
	return n
}

func (b *builder) duration(where, field string, v *scalar, def time.Duration) time.Duration {
	s := b.text(where, field, v, "")
	if s == "" && (v == nil || v.shape != "") {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		b.p.addf(where, field, "%s: invalid duration %q: want a Go duration such as 500ms, 10s, 5m or 24h", field, s)
		return def
	}
	return d
}

func (b *builder) positiveDuration(where, field string, v *scalar, def time.Duration) time.Duration {
	d := b.duration(where, field, v, def)
	if d <= 0 {
		b.p.addf(where, field, "%s must be > 0", field)
	}
	return d
}

func (b *builder) boolean(where, field string, v *scalar) bool {
	s := b.text(where, field, v, "false")
	t, err := strconv.ParseBool(s)
	if err != nil {
		b.p.addf(where, field, "%s: want true or false, got %q", field, s)
	}
	return t
}

func (b *builder) storeErrorMode(where string, v *scalar, def StoreErrorMode) StoreErrorMode {
	m := StoreErrorMode(b.text(where, "on_store_error", v, string(def)))
	if m != def && !m.Valid() {
		b.p.addf(where, "on_store_error", "on_store_error: invalid value %q: want allow or deny", m)
	}
	return m
}

// addr checks a listen address: host:port, with an empty host for all interfaces and port 0
// for any free port.
func (b *builder) addr(field string, v *scalar, def string) string {
	s := b.text("", field, v, def)
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		b.p.addf("", field, "%s: invalid address %q: want host:port", b.label(field), s)
		return s
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		b.p.addf("", field, "%s: invalid port %q: want 0 to 65535", b.label(field), port)
	}
	return s
}

// httpURL checks an absolute http or https URL; absent is "".
func (b *builder) httpURL(where, field string, v *scalar) string {
	s := b.text(where, field, v, "")
	if v != nil && v.shape == "" && !isHTTPURL(s) {
		b.p.addf(where, field, "%s: want an absolute http or https URL, got %q", field, s)
	}
	return s
}

func isHTTPURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.Opaque == "" &&
		u.Fragment == "" && !strings.Contains(s, "#")
}

// redisURL checks the redis URL. Its text is never repeated in a message: it may hold a
// password.
func (b *builder) redisURL(v *scalar) string {
	field := b.label("redis.url")
	s := b.text("", "redis.url", v, "")
	if s == "" {
		b.p.add("", "redis.url", "redis.url is required")
		return s
	}
	if _, cluster, err := ParseRedisSeeds(s); cluster {
		if err != nil {
			b.p.addf("", "redis.url", "%s: cluster seeds: %v", field, err)
		}
		return s
	}
	u, err := url.Parse(s)
	if err != nil {
		b.p.addf("", "redis.url", "%s: invalid URL: %v", field, urlErr(err))
		return s
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		b.p.addf("", "redis.url", "%s: scheme %q is not redis or rediss", field, u.Scheme)
	}
	return s
}

// natsURL checks a comma-separated list of NATS servers, each a URL or a bare host:port.
// Their text is never repeated in a message: it may hold a password or token.
func (b *builder) natsURL(v *scalar) string {
	field := b.label("nats.url")
	s := b.text("", "nats.url", v, "")
	if strings.TrimSpace(s) == "" {
		b.p.add("", "nats.url", "nats.url is required")
		return s
	}
	servers := strings.Split(s, ",")
	for i, srv := range servers {
		at := field
		if len(servers) > 1 {
			at = fmt.Sprintf("%s: server %d", field, i+1)
		}
		srv = strings.TrimSpace(srv)
		if srv == "" {
			b.p.addf("", "nats.url", "%s: empty server", at)
			continue
		}
		if !strings.Contains(srv, "://") {
			srv = "nats://" + srv
		}
		u, err := url.Parse(srv)
		switch {
		case err != nil:
			b.p.addf("", "nats.url", "%s: invalid URL: %v", at, urlErr(err))
		case u.Scheme != "nats" && u.Scheme != "tls" && u.Scheme != "ws" && u.Scheme != "wss":
			b.p.addf("", "nats.url", "%s: scheme %q is not nats, tls, ws or wss", at, u.Scheme)
		case u.Hostname() == "":
			b.p.addf("", "nats.url", "%s: missing host", at)
		}
	}
	return s
}

// urlErr returns the reason of a url.Parse error without the URL itself.
func urlErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// parseProxy parses a trusted proxy: a CIDR, or a bare IP standing for itself alone.
func parseProxy(s string) (netip.Prefix, bool) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, false
		}
		if pfx.Addr().Is4In6() && pfx.Bits() >= 96 {
			pfx = netip.PrefixFrom(pfx.Addr().Unmap(), pfx.Bits()-96)
		}
		return pfx.Masked(), true
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, false
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), true
}

// queueName is the form of a queue name: it becomes part of stream and subject names.
var queueName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func (b *builder) queue(i int, r rawQueue) Queue {
	p := b.p
	q := Queue{Name: b.text(place("queues", i, ""), "name", r.Name, "")}
	where := place("queues", i, q.Name)
	switch {
	case q.Name == "":
		p.add(where, "name", "name is required")
	case !queueName.MatchString(q.Name):
		p.addf(where, "name", "name: invalid name %q: want 1 to 64 of A-Z, a-z, 0-9, _ and -", q.Name)
	}

	if r.Rate == nil {
		p.add(where, "rate", "rate is required")
	} else if s := b.text(where, "rate", r.Rate, ""); r.Rate.shape == "" {
		if rate, err := ParseRate(s); err != nil {
			p.addf(where, "rate", "rate: %v", err)
		} else {
			q.Rate = rate
		}
	}
	q.Burst = b.integer(where, "burst", r.Burst, 0, 64)
	b.bound(where, "burst", q.Burst, 0, maxBurst)
	q.MaxDepth = b.integer(where, "max_depth", r.MaxDepth, DefaultMaxDepth, 64)
	b.bound(where, "max_depth", q.MaxDepth, 1, maxDepth)
	q.MaxBodyBytes = b.integer(where, "max_body_bytes", r.MaxBodyBytes, DefaultMaxBodyBytes, 64)
	b.bound(where, "max_body_bytes", q.MaxBodyBytes, 1, maxBodyBytes)
	q.MaxBytes = b.integer(where, "max_bytes", r.MaxBytes, max(DefaultMaxBytes, q.MaxBodyBytes), 64)
	b.bound(where, "max_bytes", q.MaxBytes, max(q.MaxBodyBytes, 1), 1<<50)
	if r.Target != nil && r.Target.shape == "" {
		q.Target = b.target(where, r.Target.text)
	} else {
		b.text(where, "target", r.Target, "")
	}
	q.MaxAttempts = int(b.integer(where, "max_attempts", r.MaxAttempts, DefaultMaxAttempts, 32))
	b.bound(where, "max_attempts", int64(q.MaxAttempts), 1, maxAttempts)
	q.Backoff = Backoff{Initial: DefaultBackoffInitial, Max: DefaultBackoffMax}
	if r.Backoff != nil {
		q.Backoff.Initial = b.positiveDuration(where, "backoff.initial", r.Backoff.Initial, DefaultBackoffInitial)
		q.Backoff.Max = b.duration(where, "backoff.max", r.Backoff.Max, DefaultBackoffMax)
	}
	if q.Backoff.Initial > 0 && q.Backoff.Max < q.Backoff.Initial {
		p.add(where, "backoff.max", "backoff.max must be >= backoff.initial")
	}
	q.Timeout = b.positiveDuration(where, "timeout", r.Timeout, DefaultTimeout)
	q.DedupeWindow = b.positiveDuration(where, "dedupe_window", r.DedupeWindow, DefaultDedupeWindow)
	q.AckWait = b.positiveDuration(where, "ack_wait", r.AckWait, DefaultAckWait)
	q.MaxDelay = b.positiveDuration(where, "max_delay", r.MaxDelay, DefaultMaxDelay)
	q.Priorities = b.boolean(where, "priorities", r.Priorities)
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"backoff.initial", q.Backoff.Initial}, {"backoff.max", q.Backoff.Max}, {"timeout", q.Timeout},
		{"dedupe_window", q.DedupeWindow}, {"ack_wait", q.AckWait}, {"max_delay", q.MaxDelay}} {
		b.boundDuration(where, d.field, d.v, maxDuration)
	}
	if q.AckWait > 0 && q.AckWait < 100*time.Millisecond {
		b.p.addf(where, "ack_wait", "ack_wait must be at least 100ms")
	}
	q.Concurrency = int(b.integer(where, "concurrency", r.Concurrency, DefaultConcurrency, 32))
	b.bound(where, "concurrency", int64(q.Concurrency), 1, maxConcurrency)
	q.MaxPauseRetries = int(b.integer(where, "max_pause_retries", r.MaxPauseRetries, DefaultMaxPauseRetries, 32))
	b.bound(where, "max_pause_retries", int64(q.MaxPauseRetries), 0, maxPauseRetries)
	q.Adaptive = b.boolean(where, "adaptive", r.Adaptive)
	if r.MinRate != nil {
		if s := b.text(where, "min_rate", r.MinRate, ""); r.MinRate.shape == "" {
			if rate, err := ParseRate(s); err != nil {
				p.addf(where, "min_rate", "min_rate: %v", err)
			} else if q.Rate.N > 0 && rate.PerSecond() > q.Rate.PerSecond() {
				p.addf(where, "min_rate", "min_rate %s must not exceed rate %s", rate, q.Rate)
			} else {
				q.MinRate = rate
			}
		}
	} else if q.Rate.N > 0 {
		q.MinRate = DefaultMinRate(q.Rate)
	}
	q.Tenant = b.keyParts(where, "tenant", r.Tenant)
	b.fairness(where, &q, &r)
	b.inFlight(where, &q, &r)
	b.queueCost(where, &q, &r)
	return q
}

// inFlight reads max_in_flight, tenant_in_flight and pause_scope; the last two need fair.
func (b *builder) inFlight(where string, q *Queue, r *rawQueue) {
	q.MaxInFlight = b.integer(where, "max_in_flight", r.MaxInFlight, 0, 64)
	b.bound(where, "max_in_flight", q.MaxInFlight, 0, maxInFlight)
	q.TenantInFlight = b.integer(where, "tenant_in_flight", r.TenantInFlight, 0, 64)
	b.bound(where, "tenant_in_flight", q.TenantInFlight, 0, maxInFlight)
	switch s := PauseScope(b.text(where, "pause_scope", r.PauseScope, string(PauseQueue))); s {
	case PauseQueue, PauseTenant:
		q.PauseScope = s
	default:
		b.p.addf(where, "pause_scope", "pause_scope: want queue or tenant, got %q", string(s))
	}
	if !q.Fair && (q.TenantInFlight > 0 || q.PauseScope == PauseTenant) {
		b.p.add(where, "fair", "tenant_in_flight and pause_scope: tenant need fair: true")
	}
	if q.MaxInFlight > 0 && q.TenantInFlight > q.MaxInFlight {
		b.p.addf(where, "tenant_in_flight", "tenant_in_flight %d must not exceed max_in_flight %d", q.TenantInFlight, q.MaxInFlight)
	}
	b.tenantSettings(where, q, r)
}

// tenantSettings reads tenant_settings: per tenant value, any of weight, rate and in_flight.
func (b *builder) tenantSettings(where string, q *Queue, r *rawQueue) {
	if len(r.TenantSettings) == 0 {
		return
	}
	if !q.Fair {
		b.p.add(where, "fair", "tenant_settings need fair: true")
	}
	q.TenantSettings = make(map[string]TenantSettings, len(r.TenantSettings))
	for _, v := range slices.Sorted(maps.Keys(r.TenantSettings)) {
		field := "tenant_settings." + v
		rs, ts := r.TenantSettings[v], TenantSettings{}
		if rs == nil {
			b.p.addf(where, field, "%s: want a mapping of weight, rate and in_flight", field)
			continue
		}
		if rs.Weight != nil {
			s := b.text(where, field+".weight", rs.Weight, "")
			w, err := strconv.ParseFloat(s, 64)
			if err != nil || !(w > 0 && w <= maxWeight) {
				b.p.addf(where, field+".weight", "%s.weight: want a number > 0 and <= %d, got %q", field, maxWeight, s)
			}
			ts.Weight = w
		}
		if rs.Rate != nil {
			s := b.text(where, field+".rate", rs.Rate, "")
			if rate, err := ParseRate(s); err != nil {
				b.p.addf(where, field+".rate", "%s.rate: %v", field, err)
			} else {
				ts.Rate = rate
			}
		}
		if rs.InFlight != nil {
			ts.InFlight = b.integer(where, field+".in_flight", rs.InFlight, 0, 64)
			b.bound(where, field+".in_flight", ts.InFlight, 1, maxInFlight)
		}
		q.TenantSettings[v] = ts
	}
}

// fairness reads fair, weights and tenant_rate, which need tenant and each other.
func (b *builder) fairness(where string, q *Queue, r *rawQueue) {
	q.Fair = b.boolean(where, "fair", r.Fair)
	if q.Fair && len(q.Tenant) == 0 {
		b.p.add(where, "fair", "fair: true needs tenant: the key parts that name who a job belongs to")
	}
	if r.Weights.shape != "" {
		b.p.addf(where, "weights", "weights: want a mapping of tenant to weight, not %s", r.Weights.shape)
	}
	for i, k := range r.Weights.keys {
		field := "weights." + k
		s := b.text(where, field, &r.Weights.vals[i], "")
		w, err := strconv.ParseFloat(s, 64)
		switch {
		case err != nil:
			b.p.addf(where, field, "%s: want a number, got %q", field, s)
			continue
		case !(w > 0 && w <= maxWeight):
			b.p.addf(where, field, "%s: %s is out of range: want > 0 and <= %d", field, s, maxWeight)
			continue
		}
		if q.Weights == nil {
			q.Weights = map[string]float64{}
		}
		q.Weights[k] = w
	}
	if r.TenantRate != nil {
		if s := b.text(where, "tenant_rate", r.TenantRate, ""); r.TenantRate.shape == "" {
			if rate, err := ParseRate(s); err != nil {
				b.p.addf(where, "tenant_rate", "tenant_rate: %v", err)
			} else {
				q.TenantRate = rate
			}
		}
	}
	if !q.Fair && (len(r.Weights.keys) > 0 || r.TenantRate != nil) {
		b.p.add(where, "fair", "weights and tenant_rate need fair: true")
	}
	if r.TenantMaxDepth != nil {
		q.TenantMaxDepth = b.integer(where, "tenant_max_depth", r.TenantMaxDepth, 0, 64)
		b.bound(where, "tenant_max_depth", q.TenantMaxDepth, 1, max(q.MaxDepth, 1))
		if !q.Fair {
			b.p.add(where, "tenant_max_depth", "tenant_max_depth needs fair: true (a tenant's backlog is a fair queue's)")
		}
	}
}

// target parses "[METHOD] URL".
func (b *builder) target(where, s string) *Target {
	t := &Target{Method: DefaultTargetMethod}
	switch f := strings.Fields(s); len(f) {
	case 1:
		t.URL = f[0]
	case 2:
		t.Method, t.URL = strings.ToUpper(f[0]), f[1]
		if !isToken(t.Method) {
			b.p.addf(where, "target", "target: invalid method %q", f[0])
			return t
		}
	default:
		b.p.addf(where, "target", "target: want \"[METHOD] URL\", got %q", s)
		return t
	}
	if !isHTTPURL(t.URL) {
		b.p.addf(where, "target", "target: want an absolute http or https URL, got %q", t.URL)
	}
	return t
}

// algorithmList is the algorithms as a message lists them.
var algorithmList = func() string {
	var names []string
	for _, a := range limit.Algorithms {
		names = append(names, string(a))
	}
	names = append(names, string(AlgorithmConcurrency))
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}()

func (b *builder) rule(i int, rr rawRule, queues map[string]int) Rule {
	r := Rule{Name: b.text(place("rules", i, ""), "name", rr.Name, "")}
	where := place("rules", i, r.Name)
	if r.Name == "" {
		b.p.add(where, "name", "name is required")
	}
	r.Match = b.match(where, rr.Match)
	r.Key = b.keyParts(where, "key", rr.Key)
	if len(r.Key) == 0 {
		r.Key = []KeyPart{{Kind: KeyIP}}
	}
	b.ruleAction(where, &r, rr)
	b.ruleLimit(where, &r, rr)
	b.ruleQueue(where, &r, rr, queues)
	r.Shadow = b.boolean(where, "shadow", rr.Shadow)
	r.OnStoreError = b.storeErrorMode(where, rr.OnStoreError, "")
	r.Lease = b.lease(where, &r, rr.Lease)
	b.ruleCost(where, &r, rr)
	if r.Concurrency() {
		r.Timeout = b.positiveDuration(where, "timeout", rr.Timeout, DefaultRuleTimeout)
		b.boundDuration(where, "timeout", r.Timeout, maxRuleTimeout)
	} else if rr.Timeout != nil {
		b.p.add(where, "timeout", "timeout applies only to algorithm: concurrency (a queue's timeout bounds its deliveries)")
	}
	return r
}

// ruleAction reads a rule's action and on_limit.
func (b *builder) ruleAction(where string, r *Rule, rr rawRule) {
	r.Action = ActionLimit
	if rr.Action != nil {
		r.Action = Action(b.text(where, "action", rr.Action, string(ActionLimit)))
		if r.Action != ActionLimit && r.Action != ActionEnqueue {
			b.p.addf(where, "action", "action: invalid value %q: want limit or enqueue", r.Action)
		}
	}
	r.OnLimit = OnLimitReject
	if rr.OnLimit != nil {
		r.OnLimit = OnLimit(b.text(where, "on_limit", rr.OnLimit, string(OnLimitReject)))
		if r.OnLimit != OnLimitReject && r.OnLimit != OnLimitEnqueue {
			b.p.addf(where, "on_limit", "on_limit: invalid value %q: want reject or enqueue", r.OnLimit)
		}
	}
}

// ruleLimit reads a rule's algorithm, limit, period and burst: required unless the rule only
// enqueues, and then not allowed without an algorithm.
func (b *builder) ruleLimit(where string, r *Rule, rr rawRule) {
	r.Algorithm = limit.Algorithm(b.text(where, "algorithm", rr.Algorithm, ""))
	r.Limit = b.integer(where, "limit", rr.Limit, 0, 64)
	r.Period = b.duration(where, "period", rr.Period, 0)
	r.Burst = b.integer(where, "burst", rr.Burst, 0, 64)
	if r.Action == ActionEnqueue && rr.Algorithm == nil {
		if rr.Limit != nil || rr.Period != nil || rr.Burst != nil {
			b.p.add(where, "algorithm", "algorithm is required when limit, period or burst is set")
		}
		return
	}
	if r.Concurrency() {
		b.concurrencyLimit(where, r, rr)
		return
	}
	for _, f := range []struct {
		name string
		v    *scalar
	}{{"algorithm", rr.Algorithm}, {"limit", rr.Limit}, {"period", rr.Period}} {
		if f.v == nil {
			b.p.addf(where, f.name, "%s is required", f.name)
		}
	}
	if r.Period > maxDuration {
		b.boundDuration(where, "period", r.Period, maxDuration)
	} else {
		b.limitSpec(where, r.LimitSpec())
	}
}

// concurrencyLimit checks the limit of an algorithm: concurrency rule: requests in flight, with
// no period or burst, for requests that are forwarded.
func (b *builder) concurrencyLimit(where string, r *Rule, rr rawRule) {
	switch {
	case rr.Limit == nil:
		b.p.add(where, "limit", "limit is required: the requests of a key in flight at once")
	case r.Limit < 1 || r.Limit > maxConns:
		b.p.addf(where, "limit", "limit must be between 1 and %d requests in flight, got %d", maxConns, r.Limit)
	}
	if rr.Period != nil {
		b.p.add(where, "period", "period does not apply to algorithm: concurrency (limit counts requests in flight; timeout bounds each)")
	}
	if rr.Burst != nil {
		b.p.add(where, "burst", "burst does not apply to algorithm: concurrency")
	}
	if r.Action == ActionEnqueue {
		b.p.add(where, "algorithm", "algorithm: concurrency caps forwarded requests; a rule with action: enqueue forwards none")
	}
}

// ruleQueue reads a rule's queue, which must exist, and is required to enqueue.
func (b *builder) ruleQueue(where string, r *Rule, rr rawRule, queues map[string]int) {
	r.Queue = b.text(where, "queue", rr.Queue, "")
	if _, ok := queues[r.Queue]; r.Queue != "" && !ok {
		b.p.addf(where, "queue", "queue: no queue named %q", r.Queue)
	}
	if r.Queue != "" {
		return
	}
	if r.Action == ActionEnqueue {
		b.p.add(where, "queue", "queue is required when action is enqueue")
	} else if r.OnLimit == OnLimitEnqueue {
		b.p.add(where, "queue", "queue is required when on_limit is enqueue")
	}
}

// lease reads a rule's lease, which needs a limit and may not exceed it.
func (b *builder) lease(where string, r *Rule, v *scalar) int64 {
	n := b.integer(where, "lease", v, 0, 64)
	switch {
	case n < 0 || n > maxLease:
		b.p.addf(where, "lease", "lease must be between 0 and %d, got %d", maxLease, n)
	case n > 0 && r.Algorithm == "":
		b.p.add(where, "lease", "lease needs a limit (algorithm, limit and period)")
	case n > 0 && r.Concurrency():
		b.p.add(where, "lease", "lease does not apply to algorithm: concurrency")
	case n > 0 && r.Limit > 0 && n > r.Limit:
		b.p.addf(where, "lease", "lease %d must not exceed limit %d", n, r.Limit)
	}
	return n
}

// match builds a rule's match section; nil matches every method and path.
func (b *builder) match(where string, rm *rawMatch) Match {
	m := Match{Path: DefaultMatchPath}
	if rm == nil {
		return m
	}
	for j, meth := range b.list(where, "match.methods", rm.Methods) {
		if !isToken(meth) {
			b.p.addf(where, fmt.Sprintf("match.methods[%d]", j), "match.methods[%d]: invalid method %q", j, meth)
		}
		m.Methods = append(m.Methods, strings.ToUpper(meth))
	}
	m.CaseInsensitive = b.boolean(where, "match.case_insensitive", rm.CaseInsensitive)
	if rm.Path != nil {
		m.Path = b.text(where, "match.path", rm.Path, DefaultMatchPath)
		b.matchPath(where, m.Path)
	}
	return m
}

// keyParts parses a list of key parts (a rule's key, a queue's tenant), naming field in errors.
func (b *builder) keyParts(where, field string, l stringList) []KeyPart {
	var parts []KeyPart
	for j, s := range b.list(where, field, l) {
		part, err := parseKeyPart(s)
		if err != nil {
			b.p.addf(where, fmt.Sprintf("%s[%d]", field, j), "%s[%d]: %v", field, j, err)
		}
		parts = append(parts, part)
	}
	return parts
}

// limitSpec reports what limit.Limit.Validate finds wrong, naming the field.
func (b *builder) limitSpec(where string, l limit.Limit) {
	err := l.Validate()
	if err == nil {
		return
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	fields := []struct {
		name     string
		sentinel error
	}{{"limit", limit.ErrInvalidLimit}, {"period", limit.ErrInvalidPeriod}, {"burst", limit.ErrInvalidBurst}}
next:
	for _, e := range errs {
		if errors.Is(e, limit.ErrUnknownAlgorithm) {
			b.p.addf(where, "algorithm", "algorithm: unknown algorithm %q: want %s", l.Algorithm, algorithmList)
			continue
		}
		// "limit: period must be > 0" names the package; in a message about the file, the
		// field is the news.
		for _, f := range fields {
			if errors.Is(e, f.sentinel) {
				b.p.add(where, f.name, strings.TrimPrefix(f.sentinel.Error(), "limit: "))
				continue next
			}
		}
		// A limit the stores cannot compute with exactly, or any other reason.
		b.p.add(where, "", strings.TrimPrefix(e.Error(), "limit: "))
	}
}

// matchPath checks a match path: absolute, with "*" only as a trailing "/*".
func (b *builder) matchPath(where, path string) {
	switch {
	case !strings.HasPrefix(path, "/"):
		b.p.add(where, "match.path", `match.path must start with "/"`)
	case strings.Contains(strings.TrimSuffix(path, "/*"), "*"):
		b.p.addf(where, "match.path", `match.path: invalid path %q: "*" is allowed only as a trailing "/*"`, path)
	case strings.ContainsAny(path, "?#"):
		b.p.addf(where, "match.path", "match.path: invalid path %q: a path holds no query or fragment", path)
	}
}

// parseKeyPart parses one key part: ip, header:NAME, query:NAME, method, path or const:TEXT.
func parseKeyPart(s string) (KeyPart, error) {
	kind, arg, hasArg := strings.Cut(s, ":")
	part := KeyPart{Kind: KeyKind(kind), Name: arg}
	switch part.Kind {
	case KeyIP, KeyMethod, KeyPath:
		if hasArg {
			return part, fmt.Errorf("%q takes no argument", kind)
		}
	case KeyHeader:
		if arg == "" {
			return part, fmt.Errorf(`"header:" needs a header name`)
		}
		if !isToken(arg) {
			return part, fmt.Errorf("invalid header name %q", arg)
		}
		part.Name = textproto.CanonicalMIMEHeaderKey(arg)
	case KeyQuery:
		if arg == "" {
			return part, fmt.Errorf(`"query:" needs a parameter name`)
		}
	case KeyConst:
		if arg == "" {
			return part, fmt.Errorf(`"const:" needs text`)
		}
	default:
		return part, fmt.Errorf("unknown part %q: want ip, header:NAME, query:NAME, method, path or const:TEXT", s)
	}
	return part, nil
}

// isToken reports whether s is an HTTP token (RFC 9110 section 5.6.2): a valid method or
// header name.
func isToken(s string) bool { return retry.IsToken(s) }
