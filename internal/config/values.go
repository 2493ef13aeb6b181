package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

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

// natsURL checks the key name (nats.url, regions.coordinator): a comma-separated list of NATS servers, each a URL or a bare host:port.
// Their text is never repeated in a message: it may hold a password or token.
func (b *builder) natsURL(name string, v *scalar) string {
	field := b.label(name)
	s := b.text("", name, v, "")
	if strings.TrimSpace(s) == "" {
		b.p.add("", name, name+" is required")
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
			b.p.addf("", name, "%s: empty server", at)
			continue
		}
		if !strings.Contains(srv, "://") {
			srv = "nats://" + srv
		}
		u, err := url.Parse(srv)
		switch {
		case err != nil:
			b.p.addf("", name, "%s: invalid URL: %v", at, urlErr(err))
		case u.Scheme != "nats" && u.Scheme != "tls" && u.Scheme != "ws" && u.Scheme != "wss":
			b.p.addf("", name, "%s: scheme %q is not nats, tls, ws or wss", at, u.Scheme)
		case u.Hostname() == "":
			b.p.addf("", name, "%s: missing host", at)
		}
	}
	return s
}

// jsDomain checks the key name (nats.jetstream_domain): empty (no domain) or one token of a
// NATS subject, as nats-server requires of a JetStream domain: no '.', '*', '>', white space
// or control character. The API subjects "$JS.<domain>.API.>" are made of it.
func (b *builder) jsDomain(name string, v *scalar) string {
	s := b.text("", name, v, "")
	if s == "" {
		return s
	}
	if i := strings.IndexFunc(s, func(r rune) bool {
		return r == '.' || r == '*' || r == '>' || unicode.IsSpace(r) || unicode.IsControl(r) || r == utf8.RuneError
	}); i >= 0 {
		r, _ := utf8.DecodeRuneInString(s[i:])
		b.p.addf("", name, "%s: %q is not a JetStream domain: it may not contain %q (a domain is one token of the subjects $JS.<domain>.API.>, as nats-server's jetstream { domain }: no dots, wildcards or white space)", b.label(name), s, r)
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
