package config

import (
	"strings"
	"testing"
	"time"
)

// TestQueueBudgets reads a queue with input and output budgets: each its own cost_rate, cost
// and reconciliation, and no unit budget of the queue's own.
func TestQueueBudgets(t *testing.T) {
	const y = `upstream: http://127.0.0.1:9000
queues:
  - name: llm
    rate: 500/m
    budgets:
      - {name: input, cost_rate: 400000/m, cost: prompt_tokens(json:/messages), cost_fallback: 30000, cost_from_response: json:/usage/prompt_tokens}
      - {name: output, cost_rate: 80000/m, cost_burst: 8000, cost: json:/max_tokens, cost_from_response: json:/usage/completion_tokens}
`
	cfg, err := Parse("sluice.yaml", []byte(y), nil)
	if err != nil {
		t.Fatal(err)
	}
	q := cfg.Queues[0]
	if q.CostRate.N != 0 || len(q.Budgets) != 2 {
		t.Fatalf("queue %+v: want no cost_rate of its own and 2 budgets", q)
	}
	in, out := q.Budgets[0], q.Budgets[1]
	if in.Name != "input" || in.CostRate != (Rate{N: 400000, Per: time.Minute}) || in.CostFallback != 30000 || in.Capacity() != 400000 {
		t.Errorf("input %+v", in)
	}
	if out.Name != "output" || out.CostBurst != 8000 || out.Capacity() != 80000 || !out.CostFromResponse.IsSet() || out.Cost.Kind != CostJSON {
		t.Errorf("output %+v", out)
	}
}

// TestQueueBudgetProblems holds the strict decode to naming the file, the queue, the budget
// and the field of each bad value.
func TestQueueBudgetProblems(t *testing.T) {
	const head = "upstream: http://127.0.0.1:9000\nqueues:\n"
	budgets := func(queue, bs string) string {
		return head + "  - {name: q, rate: 1/s, " + queue + "budgets: [" + bs + "]}\n"
	}
	in := "{name: in, cost_rate: 100/s}"
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"cost_rate on the queue", budgets("cost_rate: 5/s, ", in),
			`sluice.yaml: queues[0] "q": cost_rate: a queue with budgets takes its costs from each budget (budgets[i].cost_rate)`},
		{"cost on the queue", budgets("cost: 'json:/n', ", in),
			`sluice.yaml: queues[0] "q": cost: a queue with budgets takes its costs from each budget (budgets[i].cost)`},
		{"empty", budgets("", ""), `sluice.yaml: queues[0] "q": budgets: want at least one budget`},
		{"too many", budgets("", strings.Repeat("{name: a, cost_rate: 1/s},", 9)),
			`sluice.yaml: queues[0] "q": budgets: at most 8 budgets per queue, got 9`},
		{"global", budgets("global: true, ", in),
			`sluice.yaml: queues[0] "q": budgets: a global queue leases its rate and cost_rate across regions; budgets are not leased`},
		{"fair_by units", budgets("tenant: [header:X-T], fair: true, fair_by: units, ", in),
			`sluice.yaml: queues[0] "q": fair_by: units shares the queue's cost_rate; with budgets it is not supported`},
		{"no name", budgets("", "{cost_rate: 1/s}"), `sluice.yaml: queues[0] "q": budgets[0]: name is required`},
		{"bad name", budgets("", "{name: In Put, cost_rate: 1/s}"),
			`sluice.yaml: queues[0] "q": budgets[0] "In Put": name: invalid budget name "In Put": want 1 to 32 lower-case letters, digits, _ and -`},
		{"duplicate", budgets("", in+","+in), `sluice.yaml: queues[0] "q": budgets[1] "in": name: duplicate of budgets[0]`},
		{"no cost_rate", budgets("", "{name: in, cost: 'json:/n'}"),
			`sluice.yaml: queues[0] "q": budgets[0] "in": cost_rate is required: the units per period the budget allows`},
		{"bad cost_rate", budgets("", "{name: in, cost_rate: lots}"), `sluice.yaml: queues[0] "q": budgets[0] "in": cost_rate: `},
		{"bad cost", budgets("", "{name: in, cost_rate: 100/s, cost: 'max('}"), `sluice.yaml: queues[0] "q": budgets[0] "in": cost: `},
		{"cost above capacity", budgets("", "{name: in, cost_rate: 100/s, cost: 101}"),
			`sluice.yaml: queues[0] "q": budgets[0] "in": cost 101 exceeds what cost_rate and cost_burst can ever deliver at once (100)`},
		{"fallback above capacity", budgets("", "{name: in, cost_rate: 100/s, cost: 'json:/n', cost_fallback: 500}"),
			`sluice.yaml: queues[0] "q": budgets[0] "in": cost_fallback must be between 1 and 100, got 500`},
		{"bad response cost", budgets("", "{name: in, cost_rate: 100/s, cost_from_response: 'query:n'}"),
			`sluice.yaml: queues[0] "q": budgets[0] "in": cost_from_response: "query:n": want header:NAME or json:<JSON pointer>`},
		{"unknown field", head + "  - name: q\n    rate: 1/s\n    budgets:\n      - {name: in, cost_rate: 1/s, cost_rat: 5}\n",
			`sluice.yaml:6: queues[0] "q": unknown field "cost_rat"`},
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
