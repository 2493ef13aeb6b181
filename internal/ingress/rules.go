package ingress

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/textproto"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/httphdr"
	"github.com/sluice-rl/sluice/jsonw"
	"github.com/sluice-rl/sluice/limit"
)

// Limiter keys.
//
// The key of a request under a rule is the rule's name, a NUL, and the values of the rule's
// key parts separated by NULs: "orders-per-key\x00abc123". A part the request lacks (no such
// header or query parameter, or an empty one; no parseable peer address) is written as the
// anonymous marker \x01, so every request without an API key shares one bucket of the rule:
// absence never bypasses a limit. When a value holds control characters, or the key would be
// longer than maxPlainKey bytes, the parts are replaced by \x02 and the hex SHA-256 of an
// unambiguous encoding of them; neither marker can appear in a value written as is, so no
// two distinct requests share a key. Keys stay far below limit.MaxKeyLen, leaving
// room for a store's prefix.
const (
	anonMarker   = '\x01'
	hashMarker   = '\x02'
	maxPlainKey  = 200
	maxRuleInKey = 128 // longer rule names are hashed in keys
)

// rule is one config.Rule compiled for the request path. It is immutable.
type rule struct {
	name      string
	match     matcher
	key       []config.KeyPart
	keyPrefix string // name and NUL, or the hashed name for very long names

	hasLimit bool         // a rate limit, decided by the limiter (spec)
	conc     *concurrency // algorithm: concurrency: places held in flight (places.go); nil otherwise
	spec     limit.Limit
	leases   *leaseCache // requests taken from the store ahead (lease: N > 1); nil: none
	shadow   bool        // the rule's own shadow flag or the global one
	global   bool        // the limit is shared with other regions (gate.regionalShare)
	failOpen bool        // store-error mode allow

	onLimitEnqueue bool
	actionEnqueue  bool
	queue          string
	// waitingPerKey is the rule's deferral budget (config.Rule.WaitingPerKey): how many of a
	// key's deferred requests may wait in the queue at once; 0 for a rule that does not defer.
	waitingPerKey int64

	policy    string // RateLimit-Policy value: `"name";q=10;w=1`
	item      string // RateLimit item start: `"name"`
	limitText string // X-RateLimit-Limit value: the limit in decimal

	// The body of a 429 that this rule alone caused is quotaHead, the seconds, quotaMid, the
	// seconds, "}": Problem.appendJSON's bytes, with everything but the numbers made once.
	quotaHead, quotaMid string

	counters [numOutcomes]prometheus.Counter
	rejects  *rejectCache // rejections remembered from the shared store

	cost *ruleCost // nil: every request costs 1

	group *budgetGroup // the budgets of one rule (budgets.go); nil for a rule of its own
}

// matcher is a config.Match made ready for requests: it answers as Match.Matches does,
// without cutting and joining the path pattern for every request.
type matcher struct {
	methods []string // empty: any
	fold    bool     // compare paths without regard to ASCII case
	anyPath bool
	exact   string // the path without a trailing slash, when the pattern is not a prefix
	prefix  string // "/api" of "/api/*"; "" when exact
	under   string // "/api/" of "/api/*"
	// suffixes are the format suffixes (config.Config.FormatSuffixes) whose twins the rule
	// also matches: "/api/orders.json" under a rule on "/api/orders", "/api.json" under one
	// on "/api/*".
	suffixes []string
}

func compileMatch(m config.Match, suffixes []string) matcher {
	mt := matcher{methods: m.Methods, fold: m.CaseInsensitive, suffixes: suffixes}
	prefix, ok := strings.CutSuffix(m.Path, "/*")
	switch {
	case m.Path == "", ok && prefix == "":
		mt.anyPath = true
	case !ok:
		mt.exact = trimSlash(m.Path) // "/api/orders" and "/api/orders/" are one route
	default:
		mt.prefix, mt.under = prefix, prefix+"/"
	}
	return mt
}

// matches reports whether a request with this method and path is selected: as
// config.Match.Matches does, HEAD under a GET rule and an exact path with or without its
// trailing slash, the requests an upstream routes the same.
func (m *matcher) matches(method, path string) bool {
	if len(m.methods) > 0 && !slices.Contains(m.methods, method) &&
		(method != "HEAD" || !slices.Contains(m.methods, "GET")) {
		return false
	}
	switch {
	case m.anyPath:
		return true
	case m.prefix == "":
		return m.same(trimSlash(path), m.exact) || m.twin(trimSlash(path), m.exact)
	case m.fold:
		return strings.EqualFold(path, m.prefix) || m.twin(path, m.prefix) ||
			len(path) >= len(m.under) && strings.EqualFold(path[:len(m.under)], m.under)
	default:
		return path == m.prefix || strings.HasPrefix(path, m.under) || m.twin(path, m.prefix)
	}
}

// same compares two paths as the rule does: exactly, or without regard to ASCII case.
func (m *matcher) same(a, b string) bool {
	if m.fold {
		return strings.EqualFold(a, b)
	}
	return a == b
}

// twin reports whether path is base with one of the format suffixes ("/api/orders.json" of
// "/api/orders"). The suffix is compared without regard to case: servers that route by
// format read ".JSON" as ".json".
func (m *matcher) twin(path, base string) bool {
	if len(path) <= len(base) || path[len(base)] != '.' || !m.same(path[:len(base)], base) {
		return false
	}
	for _, s := range m.suffixes {
		if strings.EqualFold(path[len(base):], s) {
			return true
		}
	}
	return false
}

// trimSlash returns p without its trailing slash, "/" as it is.
func trimSlash(p string) string {
	if len(p) > 1 && p[len(p)-1] == '/' {
		return p[:len(p)-1]
	}
	return p
}

// defers reports whether the rule sends requests to a queue in some case.
func (r *rule) defers() bool { return r.onLimitEnqueue || r.actionEnqueue }

// ruleSet is everything a decision needs from one configuration. It is immutable; a reload
// builds a new one and swaps it in.
type ruleSet struct {
	rules        []*rule
	logDecisions bool
	trusted      trust
	v6bits       int // the prefix length that keys an IPv6 client
	storeTimeout time.Duration
	queues       map[string]*config.Queue
	upstream     *url.URL // nil when the config has none

	keyHeaders     map[string]string // key and tenant headers by foldHeaderName (scrubHeaders)
	underscoreKeys bool              // some of them have "_" in their names
}

// compile builds the rule set of cfg. It checks what a hand-built Config may lack (a Config
// from config.Load is always complete), and names the rule in its errors.
func compile(cfg *config.Config, m *metrics) (*ruleSet, error) {
	rs := &ruleSet{
		trusted:      trust(cfg.TrustedProxies),
		v6bits:       cfg.IPv6Prefix,
		logDecisions: cfg.LogDecisions,
		storeTimeout: cfg.StoreTimeoutOrDefault(),
		queues:       make(map[string]*config.Queue, len(cfg.Queues)),
	}
	for i := range cfg.Queues {
		rs.queues[cfg.Queues[i].Name] = &cfg.Queues[i]
	}
	rs.keyHeaders, rs.underscoreKeys = keyHeaderSet(cfg.Rules, cfg.Queues)
	var errs []error
	if cfg.Upstream != "" {
		u, err := url.Parse(cfg.Upstream)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("ingress: upstream %q: want an absolute http or https URL", cfg.Upstream))
		}
		rs.upstream = u
	}
	seen := make(map[string]bool, len(cfg.Rules))
	for i, cr := range cfg.Rules {
		var rules []*rule
		var err error
		if len(cr.Budgets) > 0 {
			rules, err = compileBudgets(cfg, cr, rs.queues)
		} else {
			var r *rule
			r, err = compileRule(cfg, cr, rs.queues)
			rules = []*rule{r}
		}
		for _, r := range rules {
			if err == nil && seen[r.name] {
				err = fmt.Errorf("duplicate rule name %q", r.name)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("ingress: rules[%d] %q: %w", i, cr.Name, err))
			continue
		}
		for _, r := range rules {
			seen[r.name] = true
			for o := range numOutcomes {
				r.counters[o] = m.decisions.WithLabelValues(r.name, o.String())
			}
			rs.rules = append(rs.rules, r)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return rs, nil
}

// compileRule compiles one rule of cfg, whose queues are queues. Its error is the first
// thing wrong with the rule, in the order of the steps below.
func compileRule(cfg *config.Config, cr config.Rule, queues map[string]*config.Queue) (*rule, error) {
	if err := checkName(cr.Name); err != nil {
		return nil, err
	}
	key, err := compileKey(cr.KeyParts())
	if err != nil {
		return nil, err
	}
	r := &rule{
		rejects: newRejectCache(),
		name:    cr.Name,
		match:   compileMatch(cr.Match, cfg.FormatSuffixes),
		key:     key,
		shadow:  cr.Shadow || cfg.Shadow,
		queue:   cr.Queue,
	}
	if err := r.compileActions(cr.Action, cr.OnLimit); err != nil {
		return nil, err
	}
	if err := r.compileLimit(cr); err != nil {
		return nil, err
	}
	r.compileCost(cr)
	if q, ok := queues[cr.Queue]; r.defers() && !ok {
		return nil, fmt.Errorf("no queue named %q", cr.Queue)
	} else if r.defers() {
		r.waitingPerKey = cr.WaitingPerKey(q)
	}
	if r.failOpen, err = failsOpen(cr.StoreErrorMode(cfg.OnStoreError)); err != nil {
		return nil, err
	}
	r.compileText()
	return r, nil
}

// checkName reports why name cannot name a rule: it is required, and it is a metric label.
func checkName(name string) error {
	if name == "" {
		return errors.New("name is required")
	}
	if !utf8.ValidString(name) {
		return errors.New("name is not valid UTF-8")
	}
	return nil
}

// compileKey returns a copy of a rule's key parts ready for requests, header names in canonical
// form (they are looked up in the header map as they are; the name is not part of the key).
// parts come from config.Rule.KeyParts, which holds the default of a rule without a key.
func compileKey(parts []config.KeyPart) ([]config.KeyPart, error) {
	key := slices.Clone(parts)
	for i, p := range key {
		switch p.Kind {
		case config.KeyIP, config.KeyMethod, config.KeyPath:
		case config.KeyHeader, config.KeyQuery, config.KeyConst:
			if p.Name == "" {
				return nil, fmt.Errorf("key part %q needs a name", p.Kind)
			}
		default:
			return nil, fmt.Errorf("unknown key part %q", p.Kind)
		}
		if p.Kind == config.KeyHeader {
			key[i].Name = textproto.CanonicalMIMEHeaderKey(p.Name)
		}
	}
	return key, nil
}

// compileActions sets what the rule does with a request it matches (action) and with one over
// its limit (onLimit).
func (r *rule) compileActions(action config.Action, onLimit config.OnLimit) error {
	switch action {
	case "", config.ActionLimit:
	case config.ActionEnqueue:
		r.actionEnqueue = true
	default:
		return fmt.Errorf("unknown action %q", action)
	}
	switch onLimit {
	case "", config.OnLimitReject:
	case config.OnLimitEnqueue:
		r.onLimitEnqueue = true
	default:
		return fmt.Errorf("unknown on_limit %q", onLimit)
	}
	return nil
}

// compileLimit sets the rule's limit and its leases. Every rule has a limit but an action:
// enqueue rule without an algorithm.
func (r *rule) compileLimit(cr config.Rule) error {
	if cr.Concurrency() {
		return r.compileConcurrency(cr)
	}
	r.hasLimit = !r.actionEnqueue || cr.Algorithm != ""
	if !r.hasLimit {
		return nil
	}
	r.spec = cr.LimitSpec()
	r.global = cr.Global
	if cr.Lease > 1 {
		r.leases = newLeaseCache(cr.Lease, r.spec.Period)
	}
	return r.spec.Validate()
}

// failsOpen reports whether a rule of on_store_error mode fails open.
func failsOpen(mode config.StoreErrorMode) (bool, error) {
	switch mode {
	case config.StoreErrorAllow:
		return true, nil
	case config.StoreErrorDeny:
		return false, nil
	}
	return false, fmt.Errorf("unknown on_store_error %q", mode)
}

// compileText makes the text of the rule's keys, headers and 429 body once, for every request.
func (r *rule) compileText() {
	if len(r.name) <= maxRuleInKey {
		r.keyPrefix = r.name + "\x00"
	} else {
		sum := sha256.Sum256([]byte(r.name))
		r.keyPrefix = string(hashMarker) + hex.EncodeToString(sum[:16]) + "\x00"
	}
	r.item = sfString(r.name)
	if r.conc != nil {
		r.limitText = strconv.FormatInt(r.conc.limit, 10)
		r.policy = inFlightPolicy(r.item, r.conc.limit)
	}
	if r.hasLimit {
		r.limitText = strconv.FormatInt(r.spec.Limit, 10)
		r.policy = r.item + ";q=" + r.limitText + ";w=" + strconv.FormatInt(ceilSeconds(r.spec.Period), 10)
		r.quotaHead, r.quotaMid = quotaBody(r.name)
	}
}

// quotaTitle is the title of a 429 for a rate limit.
const quotaTitle = "Request cannot be satisfied as assigned quota has been exceeded"

// quotaBody returns the constant parts of the body of a 429 that rule name alone caused: the
// JSON of &Problem{Type: QuotaExceededType, Title: quotaTitle, Status: 429, Detail:
// quotaDetail([name], s), ViolatedPolicies: [name], RetryAfter: s} is head, s, mid, s, "}".
// (JSON escapes character by character, and the seconds and " s" need none, so the detail's
// escaped text can be cut where the number goes.)
func quotaBody(name string) (head, mid string) {
	b := []byte(`{"type":`)
	b = jsonw.AppendString(b, QuotaExceededType)
	b = append(b, `,"title":`...)
	b = jsonw.AppendString(b, quotaTitle)
	b = append(b, `,"status":429,"detail":`...)
	b = jsonw.AppendString(b, "rate limit "+strconv.Quote(name)+" exceeded; retry in ")
	head = string(b[:len(b)-1]) // without the closing quote
	b = append(b[:0], ` s","violated-policies":[`...)
	b = jsonw.AppendString(b, name)
	b = append(b, `],"retry_after":`...)
	return head, string(b)
}

// sfString, appendSFString and ceilSeconds are httphdr's, which the rate-limit service's
// headers share.
func sfString(s string) string                   { return httphdr.SFString(s) }
func appendSFString(dst []byte, s string) []byte { return httphdr.AppendSFString(dst, s) }
func ceilSeconds(d time.Duration) int64          { return httphdr.CeilSeconds(d) }

// request is what key extraction reads from one request, parsed at most once.
type request struct {
	r       *http.Request
	trusted trust
	v6bits  int // keyIP masks IPv6 addresses to this prefix; 0 or 128: not at all

	// conflict names a header or query parameter that a key part reads and that the request
	// repeats with different values; "" when there is none.
	conflict string

	ipDone bool
	ip     netip.Addr
	hasIP  bool

	queryDone bool
	query     url.Values
}

func (q *request) clientIP() (netip.Addr, bool) {
	if !q.ipDone {
		q.ip, q.hasIP = clientIP(q.r.RemoteAddr, q.r.Header, q.trusted)
		q.ipDone = true
	}
	return q.ip, q.hasIP
}

// keyIP is the client address as keys use it: an IPv6 address masked to its /v6bits prefix, as
// one client usually owns a whole /64.
func (q *request) keyIP() (netip.Addr, bool) {
	a, ok := q.clientIP()
	if ok && a.Is6() && q.v6bits > 0 && q.v6bits < 128 {
		if p, err := a.Prefix(q.v6bits); err == nil {
			a = p.Addr()
		}
	}
	return a, ok
}

func (q *request) queryValue(name string) string {
	if !q.queryDone {
		q.query, _ = url.ParseQuery(q.r.URL.RawQuery) // a bad pair is skipped, the rest kept
		q.queryDone = true
	}
	return q.single("query parameter ", name, q.query[name])
}

// single returns the one value of vs, "" for none. Repeated equal values count as one; when
// they differ, it records the conflict (kind and name name the field) and returns the first:
// the request is refused before any key is used.
func (q *request) single(kind, name string, vs []string) string {
	switch len(vs) {
	case 0:
		return ""
	case 1:
		return vs[0]
	}
	for _, v := range vs[1:] {
		if v != vs[0] && q.conflict == "" {
			q.conflict = kind + name
		}
	}
	return vs[0]
}

// appendKey appends the limiter key of the request under r to dst.
func (r *rule) appendKey(dst []byte, q *request) []byte {
	return appendParts(append(dst, r.keyPrefix...), r.key, q)
}

// appendParts appends the values of the key parts of the request to dst, as appendKey
// describes.
func appendParts(dst []byte, parts []config.KeyPart, q *request) []byte {
	start := len(dst)
	unsafe := false
	for i, p := range parts {
		if i > 0 {
			dst = append(dst, 0)
		}
		if p.Kind == config.KeyIP {
			if a, ok := q.keyIP(); ok {
				dst = a.AppendTo(dst)
			} else {
				dst = append(dst, anonMarker)
			}
			continue
		}
		v := part(p, q)
		if v == "" {
			dst = append(dst, anonMarker)
			continue
		}
		if !unsafe && hasControl(v) {
			unsafe = true
		}
		dst = append(dst, v...)
	}
	if unsafe || len(dst)-start > maxPlainKey {
		// Hash an encoding that cannot be ambiguous: each part tagged absent (0) or present
		// (1, its length, its bytes).
		h := sha256.New()
		var tag [1 + binary.MaxVarintLen64]byte
		for _, p := range parts {
			var v string
			if p.Kind == config.KeyIP {
				if a, ok := q.keyIP(); ok {
					v = a.String()
				}
			} else {
				v = part(p, q)
			}
			if v == "" {
				h.Write([]byte{0})
				continue
			}
			tag[0] = 1
			n := binary.PutUvarint(tag[1:], uint64(len(v)))
			h.Write(tag[:1+n])
			io.WriteString(h, v)
		}
		dst = append(dst[:start], hashMarker)
		dst = hex.AppendEncode(dst, h.Sum(nil))
	}
	return dst
}

// part returns the value of key part p (not KeyIP) of the request, "" when it has none. A
// header or query parameter that the request repeats with different values is recorded in
// q.conflict, so that a second value cannot buy a fresh key.
func part(p config.KeyPart, q *request) string {
	switch p.Kind {
	case config.KeyHeader:
		v := q.single("header ", p.Name, q.r.Header[p.Name]) // p.Name is canonical
		if p.Name == "Authorization" {
			return canonicalBearer(v)
		}
		return v
	case config.KeyQuery:
		return q.queryValue(p.Name)
	case config.KeyMethod:
		return q.r.Method
	case config.KeyPath:
		return q.r.URL.Path
	case config.KeyConst:
		return p.Name
	}
	return ""
}

// canonicalBearer writes an Authorization value of the bearer scheme as "Bearer <token>":
// the scheme is case-insensitive and may be followed by several spaces (RFC 9110 11.4), so
// "bearer t" and "BEARER  t" are the same credential as "Bearer t" and key the same bucket
// and tenant. Other values are returned as they are. It allocates only for a value not
// already in that form.
func canonicalBearer(v string) string {
	tok, ok := httphdr.CutBearer(v)
	if !ok || len(v) == len("Bearer ")+len(tok) && v[:6] == "Bearer" {
		return v
	}
	return "Bearer " + tok
}

func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f {
			return true
		}
	}
	return false
}
