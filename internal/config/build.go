package config

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/queue"
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
	b.tracing(c, raw.Tracing)
	b.worker(c, raw.Worker)
	queueAt := b.queues(c, raw.Queues)
	b.rules(c, raw.Rules, queueAt)
	b.rls(c, raw)
	b.checkPriorityRules(c)
	b.regions(c, raw)
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
			URL:      b.natsURL("nats.url", raw.NATS.URL),
			Replicas: int(b.integer("", "nats.replicas", raw.NATS.Replicas, DefaultNATSReplicas, strconv.IntSize)),
		}
		if c.NATS.Replicas < 1 || c.NATS.Replicas > 5 {
			b.p.add("", "nats.replicas", "nats.replicas must be between 1 and 5")
		}
		c.NATS.StoreBudget = b.integer("", "nats.store_budget", raw.NATS.StoreBudget, 0, 64)
		b.bound("", "nats.store_budget", c.NATS.StoreBudget, 0, 1<<50)
		// A budget gives every queue a max_bytes of its own, which keeps it out of the shared
		// streams: with store_budget and no shared_streams, the default is a stream per queue.
		def := int64(DefaultSharedStreams)
		if c.NATS.StoreBudget > 0 {
			def = 0
		}
		shared := b.integer("", "nats.shared_streams", raw.NATS.SharedStreams, def, strconv.IntSize)
		b.bound("", "nats.shared_streams", shared, 0, queue.MaxSharedStreams)
		c.NATS.SharedStreams = int(shared)
		if shared > 0 && c.NATS.StoreBudget > 0 {
			b.p.add("", "nats.shared_streams", "nats.shared_streams cannot be set above 0 with nats.store_budget: the budget gives every queue a max_bytes of its own, which keeps it out of the shared streams; unset one of them, or set shared_streams: 0")
		}
		c.NATS.JetStreamDomain = b.jsDomain("nats.jetstream_domain", raw.NATS.JSDomain)
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
	c.ReadAheadBytes = b.integer("", "read_ahead_bytes", raw.ReadAheadBytes, DefaultReadAheadBytes, 64)
	b.bound("", "read_ahead_bytes", c.ReadAheadBytes, MaxReadAhead+1, 16<<30)
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
	b.formatSuffixes(c, raw.FormatSuffixes)
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

// DefaultFormatSuffixes are the format suffixes a rule's path also matches when the file
// sets no format_suffixes.
var DefaultFormatSuffixes = []string{".json", ".xml"}

// formatSuffixes reads format_suffixes: absent is DefaultFormatSuffixes, [] none.
func (b *builder) formatSuffixes(c *Config, l *stringList) {
	if l == nil {
		c.FormatSuffixes = slices.Clone(DefaultFormatSuffixes)
		return
	}
	c.FormatSuffixes = []string{}
	for i, s := range b.list("", "format_suffixes", *l) {
		if !validSuffix(s) {
			b.p.addf("", fmt.Sprintf("format_suffixes[%d]", i), `format_suffixes[%d]: want "." and 1 to 15 letters or digits, such as ".json", got %q`, i, s)
			continue
		}
		c.FormatSuffixes = append(c.FormatSuffixes, s)
	}
}

// validSuffix reports whether s is "." and 1 to 15 ASCII letters or digits.
func validSuffix(s string) bool {
	if len(s) < 2 || len(s) > 16 || s[0] != '.' {
		return false
	}
	for _, c := range []byte(s[1:]) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
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
	if c.NATS != nil && c.NATS.StoreBudget > 0 {
		b.storeBudget(c, raws)
	}
	return queueAt
}

// storeBudget shares nats.store_budget among the queues without their own max_bytes: what the
// queues with one reserve is taken first, the rest split equally among the streams of the
// others. A budget too small for that is a problem of nats.store_budget, or of the queue whose
// share would hold no body of max_body_bytes.
func (b *builder) storeBudget(c *Config, raws []rawQueue) {
	budget := c.NATS.StoreBudget
	var own, shared int64 // bytes reserved by max_bytes of the file; streams that share the rest
	for i := range c.Queues {
		if raws[i].MaxBytes != nil {
			own += c.Queues[i].MaxBytes * c.Queues[i].Streams()
		} else {
			shared += c.Queues[i].Streams()
		}
	}
	if own > budget {
		b.p.addf("", "nats.store_budget", "nats.store_budget: the queues' own max_bytes reserve %d bytes, more than the budget's %d; raise store_budget or lower their max_bytes", own, budget)
		return
	}
	if shared == 0 {
		return
	}
	share := (budget - own) / shared
	for i := range c.Queues {
		q := &c.Queues[i]
		if raws[i].MaxBytes != nil {
			continue
		}
		if share < q.MaxBodyBytes {
			b.p.addf(place("queues", i, q.Name), "max_bytes", "max_bytes: nats.store_budget %d shared among %d queue streams leaves %d bytes each, less than this queue's max_body_bytes %d; raise store_budget or set this queue's max_bytes", budget, shared, share, q.MaxBodyBytes)
			continue
		}
		q.MaxBytes = share
	}
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
	b.budgetNames(c, ruleAt)
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

// tracing reads the tracing section: otlp is required in it, sample_ratio is 0 to 1.
func (b *builder) tracing(c *Config, raw *rawTracing) {
	if raw == nil {
		return
	}
	t := &Tracing{OTLP: b.httpURL("", "tracing.otlp", raw.OTLP), SampleRatio: DefaultSampleRatio}
	if raw.OTLP == nil {
		b.p.add("", "tracing.otlp", "tracing.otlp is required in a tracing section: the collector's OTLP/HTTP URL, such as http://127.0.0.1:4318")
	}
	if s := b.text("", "tracing.sample_ratio", raw.SampleRatio, ""); s != "" {
		r, err := strconv.ParseFloat(s, 64)
		if err != nil || r < 0 || r > 1 {
			b.p.addf("", "tracing.sample_ratio", "tracing.sample_ratio: want a number from 0 to 1, got %q", s)
		} else {
			t.SampleRatio = r
		}
	}
	c.Tracing = t
}
