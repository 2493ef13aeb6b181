package ingress

import (
	"net/http"
	"slices"
	"strings"
	"testing"
)

// A job of a queue with budgets carries one cost per budget, read when it is accepted, each
// with its own source and fallback; a job costing more than one budget's capacity is refused
// with 422 naming that budget.
func TestJobBudgetCosts(t *testing.T) {
	f := newQueueFixture(t, `
queues:
  - name: llm
    rate: 60/m
    target: 'POST http://upstream.invalid/v1/chat'
    budgets:
      - {name: input, cost_rate: 400000/m, cost: body_bytes}
      - {name: output, cost_rate: 80000/m, cost: 'json:/max_tokens', cost_fallback: 4096}
rules:
  - {name: defer, match: {path: /v1/chat}, action: enqueue, queue: llm}
`)
	accepted(t, f.do("POST", "/v1/queues/llm/jobs", strings.NewReader(`{"max_tokens":1500}`), "Content-Type", "application/json"), "llm")
	accepted(t, f.do("POST", "/v1/queues/llm/jobs", strings.NewReader(`{}`)), "llm")
	accepted(t, f.do("POST", "/v1/chat", strings.NewReader(`{"max_tokens":700}`)), "llm")
	pb := readProblem(t, f.do("POST", "/v1/queues/llm/jobs", strings.NewReader(`{"max_tokens":80001}`)), http.StatusUnprocessableEntity)
	if !strings.Contains(pb.Detail, `of budget "output" and queue "llm" delivers at most 80000 of them at once`) {
		t.Errorf("422 detail %q", pb.Detail)
	}
	jobs := f.fetch(t, "llm", 3)
	want := [][]int64{{19, 1500}, {2, 4096}, {18, 700}}
	for i, j := range jobs {
		if !slices.Equal(j.Costs, want[i]) || j.Cost != 0 {
			t.Errorf("job %d costs %v (own cost %d), want %v (body bytes, then max_tokens or the fallback)", i, j.Costs, j.Cost, want[i])
		}
	}
}
