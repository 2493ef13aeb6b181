package config

import (
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/sluice-rl/sluice/internal/httphdr"
)

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
	q.MaxBytes = DefaultMaxBytes // or a share of nats.store_budget (storeBudget)
	if r.MaxBytes != nil {
		q.MaxBytes = b.integer(where, "max_bytes", r.MaxBytes, DefaultMaxBytes, 64)
		b.bound(where, "max_bytes", q.MaxBytes, max(q.MaxBodyBytes, 1), 1<<50)
	}
	if r.Target != nil && r.Target.shape == "" {
		q.Target = b.target(where, r.Target.text)
	} else {
		b.text(where, "target", r.Target, "")
	}
	b.delivery(where, &q, &r)
	q.Adaptive = b.boolean(where, "adaptive", r.Adaptive)
	q.Global = b.boolean(where, "global", r.Global)
	b.minRate(where, &q, &r)
	q.Tenant = b.keyParts(where, "tenant", r.Tenant)
	b.fairness(where, &q, &r)
	b.inFlight(where, &q, &r)
	if r.Budgets != nil {
		b.queueBudgets(where, &q, &r)
	} else {
		b.queueCost(where, &q, &r)
	}
	b.fairBy(where, &q, &r)
	q.canonicalTenantValues()
	return q
}

// delivery reads how queue q's jobs are delivered: attempts, backoff, timeouts, windows and
// concurrency, each bounded.
func (b *builder) delivery(where string, q *Queue, r *rawQueue) {
	p := b.p
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
	b.priorities(where, q, r.Priorities)
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
}

// minRate reads an adaptive queue's floor: at most its rate; by default DefaultMinRate.
func (b *builder) minRate(where string, q *Queue, r *rawQueue) {
	p := b.p
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
}

// canonicalTenantValues writes the tenant values weights and tenant_settings name as the
// ingress reads them: the part read from header:Authorization with its bearer scheme as
// "Bearer <token>", in whatever case the file writes it (the ingress reads the scheme without
// regard to case, so "bearer t" and "Bearer t" are one tenant).
func (q *Queue) canonicalTenantValues() {
	at := slices.IndexFunc(q.Tenant, func(p KeyPart) bool { return p.Kind == KeyHeader && strings.EqualFold(p.Name, "Authorization") })
	if at < 0 {
		return
	}
	canon := func(v string) string {
		parts := strings.Split(v, "\x00")
		if at < len(parts) {
			if tok, ok := httphdr.CutBearer(parts[at]); ok {
				parts[at] = "Bearer " + tok
			}
		}
		return strings.Join(parts, "\x00")
	}
	if len(q.Weights) > 0 {
		weights := make(map[string]float64, len(q.Weights))
		for v, w := range q.Weights {
			weights[canon(v)] = w
		}
		q.Weights = weights
	}
	if len(q.TenantSettings) > 0 {
		settings := make(map[string]TenantSettings, len(q.TenantSettings))
		for v, ts := range q.TenantSettings {
			settings[canon(v)] = ts
		}
		q.TenantSettings = settings
	}
}

// inFlight reads max_in_flight, tenant_in_flight and pause_scope; the last two need fair.
func (b *builder) inFlight(where string, q *Queue, r *rawQueue) {
	q.MaxInFlight = b.integer(where, "max_in_flight", r.MaxInFlight, 0, 64)
	b.bound(where, "max_in_flight", q.MaxInFlight, 0, maxInFlight)
	q.TenantInFlight = b.integer(where, "tenant_in_flight", r.TenantInFlight, 0, 64)
	b.bound(where, "tenant_in_flight", q.TenantInFlight, 0, maxInFlight)
	q.pauseScopeSet = r.PauseScope != nil
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

// tenantSettings reads tenant_settings: per tenant value, any of label, weight, rate and
// in_flight.
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
			b.p.addf(where, field, "%s: want a mapping of label, weight, rate and in_flight", field)
			continue
		}
		if rs.Label != nil {
			ts.Label = b.text(where, field+".label", rs.Label, "")
			switch {
			case len(ts.Label) > 64 || !utf8.ValidString(ts.Label) || strings.IndexFunc(ts.Label, unicode.IsControl) >= 0:
				b.p.addf(where, field+".label", "%s.label: want up to 64 printable characters", field)
			case ts.Label == v:
				b.p.addf(where, field+".label", "%s.label: must not be the tenant's value, which admin reads never show; name the tenant instead (such as \"acme\")", field)
			}
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
		if len(q.Tenant) == 0 {
			b.p.add(where, "tenant_max_depth", "tenant_max_depth needs tenant (whose jobs it counts)")
		}
	}
}

// fairBy reads fair_by, which needs fair and, to count units, cost_rate.
func (b *builder) fairBy(where string, q *Queue, r *rawQueue) {
	if r.FairBy == nil {
		return
	}
	switch s := FairBy(b.text(where, "fair_by", r.FairBy, "")); s {
	case FairByJobs, FairByUnits:
		q.FairBy = s
	default:
		b.p.addf(where, "fair_by", "fair_by: want jobs or units, got %q", string(s))
		return
	}
	switch {
	case !q.Fair:
		b.p.add(where, "fair_by", "fair_by needs fair: true")
	case q.FairBy == FairByUnits && len(q.Budgets) > 0:
		b.p.add(where, "fair_by", "fair_by: units shares the queue's cost_rate; with budgets it is not supported (fair_by: jobs shares jobs)")
	case q.FairBy == FairByUnits && q.CostRate.N == 0:
		b.p.add(where, "fair_by", "fair_by: units needs cost_rate, the units the tenants share")
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
