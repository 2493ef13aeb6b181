package config

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/limit"
)

// TestBudgets reads a rule with input and output budgets: each its own limit, cost and
// reconciliation, the rule's algorithm their default.
func TestBudgets(t *testing.T) {
	const y = `upstream: http://127.0.0.1:9000
rules:
  - name: tokens
    key: [header:Authorization]
    algorithm: sliding_window
    budgets:
      - name: input
        limit: 400000
        period: 1m
        cost: prompt_tokens(json:/messages)
        cost_fallback: 30000
        cost_from_response: json:/usage/input_tokens + json:/usage/cache_read_input_tokens + json:/usage/cache_creation_input_tokens
      - name: output
        algorithm: token_bucket
        limit: 80000
        period: 1m
        burst: 8000
        cost: max(json:/max_tokens, 4096)
        cost_from_response: json:/usage/output_tokens
`
	cfg, err := Parse("sluice.yaml", []byte(y), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Rules[0]
	if r.HasLimit() || len(r.Budgets) != 2 {
		t.Fatalf("rule %+v: want no limit of its own and 2 budgets", r)
	}
	in, out := r.Budgets[0], r.Budgets[1]
	if got, want := in.LimitSpec(), (limit.Limit{Algorithm: limit.SlidingWindow, Limit: 400000, Period: time.Minute, Refunds: true}); got != want {
		t.Errorf("input limit %+v, want %+v", got, want)
	}
	if got, want := out.LimitSpec(), (limit.Limit{Algorithm: limit.TokenBucket, Limit: 80000, Period: time.Minute, Burst: 8000, Refunds: true}); got != want {
		t.Errorf("output limit %+v, want %+v", got, want)
	}
	if in.CostFallback != 30000 || !in.Cost.IsExpr() || !in.CostFromResponse.IsExpr() || !out.CostFromResponse.IsSet() {
		t.Errorf("costs not read: %+v / %+v", in, out)
	}
	if got := out.FullName(r.Name); got != "tokens/output" {
		t.Errorf("FullName %q", got)
	}
}

// TestBudgetProblems holds the strict decode to naming the file, the rule, the budget and the
// field of each bad value.
func TestBudgetProblems(t *testing.T) {
	const head = "upstream: http://127.0.0.1:9000\nqueues:\n  - {name: q, rate: 1/s}\nrules:\n"
	budgets := func(rule, bs string) string {
		return head + "  - {name: t, " + rule + "budgets: [" + bs + "]}\n"
	}
	in := "{name: in, limit: 100, period: 1s}"
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"limit on the rule", budgets("algorithm: gcra, limit: 5, ", in),
			`sluice.yaml: rules[0] "t": limit: a rule with budgets takes its limits and costs from each budget (budgets[i].limit)`},
		{"cost on the rule", budgets("algorithm: gcra, cost: 'json:/n', ", in),
			`sluice.yaml: rules[0] "t": cost: a rule with budgets takes its limits and costs from each budget (budgets[i].cost)`},
		{"lease on the rule", budgets("algorithm: gcra, lease: 5, ", in),
			`sluice.yaml: rules[0] "t": lease: a rule with budgets takes its limits and costs from each budget (budgets[i].lease)`},
		{"empty", budgets("algorithm: gcra, ", ""), `sluice.yaml: rules[0] "t": budgets: want at least one budget`},
		{"too many", budgets("algorithm: gcra, ", strings.Repeat("{name: a, limit: 1, period: 1s},", 9)),
			`sluice.yaml: rules[0] "t": budgets: at most 8 budgets per rule, got 9`},
		{"defers", budgets("algorithm: gcra, on_limit: enqueue, queue: q, ", in),
			`sluice.yaml: rules[0] "t": budgets: a rule with budgets rejects (on_limit: reject, action: limit); deferring it to a queue is not supported`},
		{"concurrency", budgets("algorithm: concurrency, ", in),
			`sluice.yaml: rules[0] "t": algorithm: concurrency caps requests in flight; it cannot be a unit budget`},
		{"no name", budgets("algorithm: gcra, ", "{limit: 1, period: 1s}"), `sluice.yaml: rules[0] "t": budgets[0]: name is required`},
		{"bad name", budgets("algorithm: gcra, ", "{name: In Put, limit: 1, period: 1s}"),
			`sluice.yaml: rules[0] "t": budgets[0] "In Put": name: invalid budget name "In Put": want 1 to 32 lower-case letters, digits, _ and -`},
		{"duplicate", budgets("algorithm: gcra, ", in+","+in), `sluice.yaml: rules[0] "t": budgets[1] "in": name: duplicate of budgets[0]`},
		{"no algorithm", budgets("", in), `sluice.yaml: rules[0] "t": budgets[0] "in": algorithm is required`},
		{"no limit", budgets("algorithm: gcra, ", "{name: in, period: 1s}"), `sluice.yaml: rules[0] "t": budgets[0] "in": limit is required`},
		{"zero limit", budgets("algorithm: gcra, ", "{name: in, limit: 0, period: 1s}"), `sluice.yaml: rules[0] "t": budgets[0] "in": limit must be > 0`},
		{"bad period", budgets("algorithm: gcra, ", "{name: in, limit: 1, period: soon}"),
			`sluice.yaml: rules[0] "t": budgets[0] "in": period: invalid duration "soon": want a Go duration such as 500ms, 10s, 5m or 24h`},
		{"unknown algorithm", budgets("", "{name: in, algorithm: magic, limit: 1, period: 1s}"),
			`sluice.yaml: rules[0] "t": budgets[0] "in": algorithm: unknown algorithm "magic": want token_bucket, leaky_bucket, fixed_window, sliding_log, sliding_window, gcra or concurrency`},
		{"concurrency budget", budgets("", "{name: in, algorithm: concurrency, limit: 1}"),
			`sluice.yaml: rules[0] "t": budgets[0] "in": algorithm: concurrency caps requests in flight; it cannot be a unit budget`},
		{"bad cost", budgets("algorithm: gcra, ", "{name: in, limit: 100, period: 1s, cost: 'max('}"),
			`sluice.yaml: rules[0] "t": budgets[0] "in": cost: `},
		{"cost above capacity", budgets("algorithm: gcra, ", "{name: in, limit: 100, period: 1s, cost: 101}"),
			`sluice.yaml: rules[0] "t": budgets[0] "in": cost 101 exceeds what the limit can ever admit at once (100)`},
		{"fallback above capacity", budgets("algorithm: gcra, ", "{name: in, limit: 100, period: 1s, cost: 'json:/n', cost_fallback: 500}"),
			`sluice.yaml: rules[0] "t": budgets[0] "in": cost_fallback must be between 1 and 100, got 500`},
		{"bad response cost", budgets("algorithm: gcra, ", "{name: in, limit: 100, period: 1s, cost_from_response: 'query:n'}"),
			`sluice.yaml: rules[0] "t": budgets[0] "in": cost_from_response: "query:n": want header:NAME or json:<JSON pointer> (what the upstream's answer carries)`},
		{"sliding_log reconciled", budgets("", "{name: in, algorithm: sliding_log, limit: 100, period: 1s, cost_from_response: 'json:/u'}"),
			`sluice.yaml: rules[0] "t": budgets[0] "in": cost_from_response needs an algorithm that carries debt`},
		{"name taken by a rule", head + "  - {name: t, algorithm: gcra, budgets: [" + in + "]}\n  - {name: t/in, algorithm: gcra, limit: 1, period: 1s}\n",
			`sluice.yaml: rules[0] "t": budgets[0] "in": name: "t/in", the budget's name in headers and metrics, is the name of rules[1]`},
		{"unknown field", head + "  - name: t\n    algorithm: gcra\n    budgets:\n      - {name: in, limit: 1, period: 1s, limt: 5}\n",
			`sluice.yaml:8: rules[0] "t": unknown field "limt"`},
		{"scalar budgets", head + "  - {name: t, algorithm: gcra, budgets: input}\n", `sluice.yaml:5: rules[0] "t": want another kind of value, not a single value`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines := problemLines(t, tc.yaml)
			for _, l := range lines {
				if strings.HasPrefix(l, tc.want) {
					return
				}
			}
			t.Errorf("no line starting\n%s\nin\n%s", tc.want, strings.Join(lines, "\n"))
		})
	}
}

// mustCost parses a cost for a test's expectations.
func mustCost(t *testing.T, s string, response bool) Cost {
	t.Helper()
	c, err := ParseCost(s, response)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
