package config

// QueueBudget is one of a queue's unit budgets (YAML budgets): units per period of its own
// (input tokens, output tokens), charged its own cost at acceptance and reconciled from its
// own part of the answer. A job of the queue waits until every budget has its units (and the
// queue's rate has its slot); a job whose cost exceeds a budget's capacity is refused at
// acceptance (docs/llm.md, "Queue budgets").
type QueueBudget struct {
	// Name names the budget within its queue (lower-case letters, digits, "_" and "-", at
	// most 32): it names the budget's schedule in Redis and its metrics.
	Name string
	// CostRate, CostBurst, Cost, CostFallback and CostFromResponse are as a queue's own
	// cost_rate, cost_burst, cost, cost_fallback and cost_from_response; CostRate is required.
	CostRate         Rate
	CostBurst        int64
	Cost             Cost
	CostFallback     int64
	CostFromResponse Cost
}

// Capacity is the largest cost one job may have on the budget: the units its cost_rate allows
// in one period, or cost_burst if that is larger.
func (b QueueBudget) Capacity() int64 { return max(b.CostRate.N, b.CostBurst) }

// rawQueueBudget is one budget of a queue, as YAML has it.
type rawQueueBudget struct {
	Name             *scalar `yaml:"name"`
	CostRate         *scalar `yaml:"cost_rate"`
	CostBurst        *scalar `yaml:"cost_burst"`
	Cost             *scalar `yaml:"cost"`
	CostFallback     *scalar `yaml:"cost_fallback"`
	CostFromResponse *scalar `yaml:"cost_from_response"`
}

// queueBudgets reads a queue's budgets: 1 to MaxBudgets, named distinctly, each read as a
// queue's own cost keys are (queueCost), exclusive with those keys. global (budgets are not
// leased across regions) and fair_by: units (which budget would the tenants share?) are
// refused beside them.
func (b *builder) queueBudgets(where string, q *Queue, r *rawQueue) {
	for _, f := range []struct {
		name string
		v    *scalar
	}{{"cost_rate", r.CostRate}, {"cost_burst", r.CostBurst}, {"cost", r.Cost},
		{"cost_fallback", r.CostFallback}, {"cost_from_response", r.CostFromResponse}} {
		if f.v != nil {
			b.p.addf(where, f.name, "%s: a queue with budgets takes its costs from each budget (budgets[i].%s)", f.name, f.name)
		}
	}
	switch {
	case len(r.Budgets) == 0:
		b.p.add(where, "budgets", "budgets: want at least one budget")
	case len(r.Budgets) > MaxBudgets:
		b.p.addf(where, "budgets", "budgets: at most %d budgets per queue, got %d", MaxBudgets, len(r.Budgets))
	}
	if q.Global {
		b.p.add(where, "budgets", "budgets: a global queue leases its rate and cost_rate across regions; budgets are not leased")
	}
	seen := map[string]int{}
	for j, rb := range r.Budgets {
		bu := b.queueBudget(where, j, rb)
		if k, dup := seen[bu.Name]; dup && bu.Name != "" {
			b.p.addf(where+": "+place("budgets", j, bu.Name), "name", "name: duplicate of budgets[%d]", k)
		} else {
			seen[bu.Name] = j
		}
		q.Budgets = append(q.Budgets, bu)
	}
}

// queueBudget reads budget j of a queue at where.
func (b *builder) queueBudget(where string, j int, rb rawQueueBudget) QueueBudget {
	bu := QueueBudget{Name: b.text(where+": "+place("budgets", j, ""), "name", rb.Name, "")}
	at := where + ": " + place("budgets", j, bu.Name)
	if rb.Name == nil {
		b.p.add(at, "name", "name is required")
	} else if !budgetName(bu.Name) {
		b.p.addf(at, "name", "name: invalid budget name %q: want 1 to 32 lower-case letters, digits, _ and -", bu.Name)
	}
	if rb.CostRate == nil {
		b.p.add(at, "cost_rate", "cost_rate is required: the units per period the budget allows")
	}
	// The budget's keys are read as a queue's own, so that they are checked alike.
	var as Queue
	b.queueCost(at, &as, &rawQueue{CostRate: rb.CostRate, CostBurst: rb.CostBurst, Cost: rb.Cost,
		CostFallback: rb.CostFallback, CostFromResponse: rb.CostFromResponse})
	bu.CostRate, bu.CostBurst, bu.Cost = as.CostRate, as.CostBurst, as.Cost
	bu.CostFallback, bu.CostFromResponse = as.CostFallback, as.CostFromResponse
	return bu
}
