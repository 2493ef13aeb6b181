package config

import (
	"time"

	"github.com/sluice-rl/sluice/limit"
)

// Budget is one of a rule's unit budgets (YAML budgets): a limit of its own, charged its own
// cost and reconciled from its own part of the answer, for upstreams that budget input and
// output tokens separately. A request passes the rule only when every budget admits it; the
// ingress then charges each budget its own cost (docs/llm.md, "Separate input and output
// budgets").
type Budget struct {
	// Name names the budget within its rule (lower-case letters, digits, "_" and "-"). The
	// rate-limit headers, problem bodies and metrics report the budget as "<rule>/<name>"
	// (FullName).
	Name string
	// Algorithm, Limit, Period and Burst are the budget's limit, as a Rule's are. Algorithm
	// defaults to the rule's algorithm; concurrency is not a budget.
	Algorithm limit.Algorithm
	Limit     int64
	Period    time.Duration
	Burst     int64
	// Cost, CostFallback and CostFromResponse are as a Rule's: what a request costs this
	// budget on entry (default 1), its cost when that cannot be read (0: the capacity), and
	// where the answer reports the true cost (zero: the charge stands).
	Cost             Cost
	CostFallback     int64
	CostFromResponse Cost
}

// MaxBudgets is the most budgets one rule may have.
const MaxBudgets = 8

// LimitSpec returns the budget's limit as the limiters take it, with Refunds when the budget
// reconciles its charges (as Rule.LimitSpec).
func (b Budget) LimitSpec() limit.Limit {
	return limit.Limit{Algorithm: b.Algorithm, Limit: b.Limit, Period: b.Period, Burst: b.Burst,
		Refunds: b.CostFromResponse.IsSet()}
}

// FullName is the budget's name in headers, problem bodies and metrics: "<rule>/<budget>".
func (b Budget) FullName(rule string) string { return rule + "/" + b.Name }

// ruleBudgets reads a rule's budgets. A rule with budgets has no limit or cost of its own (its
// algorithm is the budgets' default), and neither defers nor leases: each budget is a limit
// with its own cost and reconciliation, read as a rule's are.
func (b *builder) ruleBudgets(where string, r *Rule, rr rawRule) {
	def := rr.Algorithm
	if def != nil && limit.Algorithm(b.text(where, "algorithm", def, "")) == AlgorithmConcurrency {
		b.p.add(where, "algorithm", "algorithm: concurrency caps requests in flight; it cannot be a unit budget")
		def = nil
	}
	for _, f := range []struct {
		name string
		v    *scalar
	}{{"limit", rr.Limit}, {"period", rr.Period}, {"burst", rr.Burst}, {"cost", rr.Cost},
		{"cost_fallback", rr.CostFallback}, {"cost_from_response", rr.CostFromResponse}, {"lease", rr.Lease}} {
		if f.v != nil {
			b.p.addf(where, f.name, "%s: a rule with budgets takes its limits and costs from each budget (budgets[i].%s)", f.name, f.name)
		}
	}
	switch {
	case len(rr.Budgets) == 0:
		b.p.add(where, "budgets", "budgets: want at least one budget")
	case len(rr.Budgets) > MaxBudgets:
		b.p.addf(where, "budgets", "budgets: at most %d budgets per rule, got %d", MaxBudgets, len(rr.Budgets))
	}
	if r.Action == ActionEnqueue || r.OnLimit == OnLimitEnqueue {
		b.p.add(where, "budgets", "budgets: a rule with budgets rejects (on_limit: reject, action: limit); deferring it to a queue is not supported")
	}
	seen := map[string]int{}
	for j, rb := range rr.Budgets {
		bu := b.budget(where, j, rb, def)
		if k, dup := seen[bu.Name]; dup && bu.Name != "" {
			b.p.addf(where+": "+place("budgets", j, bu.Name), "name", "name: duplicate of budgets[%d]", k)
		} else {
			seen[bu.Name] = j
		}
		r.Budgets = append(r.Budgets, bu)
	}
}

// budget reads budget j of a rule at where; def is the rule's algorithm, the default.
func (b *builder) budget(where string, j int, rb rawBudget, def *scalar) Budget {
	bu := Budget{Name: b.text(where+": "+place("budgets", j, ""), "name", rb.Name, "")}
	at := where + ": " + place("budgets", j, bu.Name)
	if rb.Name == nil {
		b.p.add(at, "name", "name is required")
	} else if !budgetName(bu.Name) {
		b.p.addf(at, "name", "name: invalid budget name %q: want 1 to 32 lower-case letters, digits, _ and -", bu.Name)
	}
	alg := rb.Algorithm
	if alg == nil {
		alg = def
	}
	if alg != nil && limit.Algorithm(b.text(at, "algorithm", alg, "")) == AlgorithmConcurrency {
		b.p.add(at, "algorithm", "algorithm: concurrency caps requests in flight; it cannot be a unit budget")
		return bu
	}
	// The budget's limit and cost are read as a rule's, so that they are checked alike.
	as := Rule{Action: ActionLimit}
	raw := rawRule{Algorithm: alg, Limit: rb.Limit, Period: rb.Period, Burst: rb.Burst,
		Cost: rb.Cost, CostFallback: rb.CostFallback, CostFromResponse: rb.CostFromResponse}
	b.ruleLimit(at, &as, raw)
	b.ruleCost(at, &as, raw)
	bu.Algorithm, bu.Limit, bu.Period, bu.Burst = as.Algorithm, as.Limit, as.Period, as.Burst
	bu.Cost, bu.CostFallback, bu.CostFromResponse = as.Cost, as.CostFallback, as.CostFromResponse
	return bu
}

// budgetName reports whether s can name a budget: it goes into limiter keys and headers.
func budgetName(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// budgetNames reports a budget whose full name ("<rule>/<budget>", which headers and metrics
// carry) is the name of another rule.
func (b *builder) budgetNames(c *Config, ruleAt map[string]int) {
	for i, r := range c.Rules {
		for j, bu := range r.Budgets {
			if k, taken := ruleAt[bu.FullName(r.Name)]; taken && bu.Name != "" {
				b.p.addf(place("rules", i, r.Name)+": "+place("budgets", j, bu.Name), "name",
					"name: %q, the budget's name in headers and metrics, is the name of rules[%d]", bu.FullName(r.Name), k)
			}
		}
	}
}
