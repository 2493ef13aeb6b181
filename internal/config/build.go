package config

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"
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
