package config

import (
	"errors"
	"fmt"
	"net/textproto"
	"strings"

	"github.com/sluice-rl/sluice/limit"
	"github.com/sluice-rl/sluice/retry"
)

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
	r.Key = r.KeyParts()
	b.ruleAction(where, &r, rr)
	if rr.Budgets != nil {
		b.ruleBudgets(where, &r, rr)
	} else {
		b.ruleLimit(where, &r, rr)
	}
	b.ruleQueue(where, &r, rr, queues)
	r.Shadow = b.boolean(where, "shadow", rr.Shadow)
	r.Global = b.boolean(where, "global", rr.Global)
	r.OnStoreError = b.storeErrorMode(where, rr.OnStoreError, "")
	r.OnStoreReset = b.storeResetMode(where, &r, rr.OnStoreReset)
	if rr.Budgets == nil {
		r.Lease = b.lease(where, &r, rr.Lease)
		b.ruleCost(where, &r, rr)
	}
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
	if rr.MaxWaitingPerKey != nil {
		r.MaxWaitingPerKey = b.integer(where, "max_waiting_per_key", rr.MaxWaitingPerKey, 0, 64)
		switch {
		case r.Queue == "":
			b.p.add(where, "max_waiting_per_key", "max_waiting_per_key needs a queue (on_limit: enqueue or action: enqueue)")
		default:
			b.bound(where, "max_waiting_per_key", r.MaxWaitingPerKey, 1, maxDepth)
		}
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

// storeResetMode reads a rule's on_store_reset: allow or conservative, for rules with a limit
// per period only.
func (b *builder) storeResetMode(where string, r *Rule, v *scalar) limit.ResetMode {
	if v == nil {
		return ""
	}
	m := limit.ResetMode(b.text(where, "on_store_reset", v, ""))
	switch {
	case m != limit.ResetFresh && m != limit.ResetConservative:
		b.p.addf(where, "on_store_reset", "on_store_reset: invalid value %q: want allow (start afresh) or hold (refuse until the limit would be whole again)", m)
		return ""
	case r.Concurrency():
		b.p.add(where, "on_store_reset", "on_store_reset applies to rules with a limit per period: a concurrency rule's places are fenced after a loss of Redis's state by themselves")
	case !r.HasLimit():
		b.p.add(where, "on_store_reset", "on_store_reset applies to rules with a limit per period: set algorithm, limit and period, or drop it")
	}
	return m
}
