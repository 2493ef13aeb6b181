package ingress

import (
	"cmp"
	"fmt"
	"net/http"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/cost"
)

// ruleCost is how a rule with a cost charges a request: read from spec, else fallback; at
// most capacity, the most its limit ever admits at once.
type ruleCost struct {
	spec     config.Cost
	fallback int64
	capacity int64
	from     config.Cost // cost_from_response; zero: the charge stands
	onCut    config.CutCharge
	cutDebt  int64 // cut_on_debt: end a stream this far above its charge; 0: never
}

// compileCost sets the rule's cost, when it has one. A rule whose cost varies by request, or
// is reconciled, remembers no rejections: a rejection of a costly request says nothing of a
// cheap one, and a refund may make room before the remembered Retry-After.
func (r *rule) compileCost(cr config.Rule) {
	if !cr.Cost.IsSet() && !cr.CostFromResponse.IsSet() || !r.hasLimit {
		return
	}
	capacity := r.spec.Capacity()
	r.cost = &ruleCost{spec: cr.Cost, fallback: config.Fallback(cr.CostFallback, capacity), capacity: capacity,
		from: cr.CostFromResponse, onCut: cmp.Or(cr.CostOnCut, config.CutEstimate), cutDebt: cr.CutOnDebt}
	if cr.Cost.Kind != config.CostNumber || cr.CostFromResponse.IsSet() {
		r.rejects = nil
	}
}

// readsBody reports whether the cost needs the body of a request that has Content-Length n
// (-1: unknown).
func readsBody(c config.Cost, n int64) bool {
	if c.IsExpr() {
		return c.Reads(func(k config.CostKind) bool {
			return k == config.CostJSON || k == config.CostBodyBytes || k == config.CostPromptTokens
		})
	}
	return c.Kind == config.CostJSON || c.Kind == config.CostBodyBytes && n < 0
}

// requestCost reads what a request costs under c, reading the body ahead into k once when c
// needs it. It returns the problem to answer instead: a body that could not be read, or a cost
// above capacity, which no wait would ever admit.
func (k *call) requestCost(r *http.Request, c *ruleCost, m *metrics) (int64, *Problem) {
	return readCost(r, c.spec, c.fallback, c.capacity, &k.costBody, m, "rate limit", func(n int64) string {
		return fmt.Sprintf("this request costs %d units (%s) and the limit admits at most %d at once", n, c.spec, c.capacity)
	})
}

// costBody is a request's body as read ahead for its costs: read once, by the first cost that
// needs it.
type costBody struct {
	read  bool
	whole bool
	b     []byte
}

// readCost reads a cost of spec from r, with fallback when it cannot, and refuses one above
// capacity with 422 (what names the policy in the detail).
//
// The body is read ahead within the read-ahead bound of m (read_ahead_bytes): a request that
// finds it held by others is charged fallback without its body being read, and counted.
func readCost(r *http.Request, spec config.Cost, fallback, capacity int64, cb *costBody, m *metrics, what string, detail func(int64) string) (int64, *Problem) {
	var body []byte
	if readsBody(spec, r.ContentLength) {
		if !cb.read {
			cb.read = true
			if br, ok := r.Body.(*bodyReader); ok {
				head, whole, skipped, err := br.peek(&m.readAhead, config.MaxReadAhead, r.ContentLength)
				if err != nil {
					if p := br.problem(); p != nil {
						return 0, p
					}
				}
				if skipped {
					m.readAheadSkips.Inc()
				}
				cb.b, cb.whole = head, whole
			} else {
				cb.whole = true // no body
			}
		}
		if !cb.whole {
			return min(fallback, capacity), nil
		}
		body = cb.b
	} else if spec.Kind == config.CostBodyBytes {
		return checkCost(max(r.ContentLength, 1), capacity, what, detail)
	}
	n, ok := cost.FromRequest(spec, r.Header, r.URL.RawQuery, body)
	if !ok {
		return min(fallback, capacity), nil
	}
	return checkCost(n, capacity, what, detail)
}

// checkCost refuses a cost above capacity.
func checkCost(n, capacity int64, what string, detail func(int64) string) (int64, *Problem) {
	if n > capacity {
		return 0, &Problem{Type: "about:blank", Title: "Cost exceeds the " + what, Status: http.StatusUnprocessableEntity,
			Detail: detail(n)}
	}
	return n, nil
}

// jobCost is what a job of r costs in queue q's units (body: the job's, read whole), or 0 for
// a queue without cost_rate. A cost above what cost_rate and cost_burst can deliver at once is
// refused with 422: the upstream would refuse it at any rate.
func jobCost(q *config.Queue, r *http.Request, body []byte) (int64, error) {
	if q.CostRate.N == 0 {
		return 0, nil
	}
	capacity := q.CostCapacity()
	n, ok := cost.FromRequest(q.Cost, r.Header, r.URL.RawQuery, body)
	if !ok {
		return config.Fallback(q.CostFallback, capacity), nil
	}
	n, p := checkCost(n, capacity, "queue's budget", func(n int64) string {
		return fmt.Sprintf("this job costs %d units (%s) and queue %q delivers at most %d at once (cost_rate %s, cost_burst %d)",
			n, q.Cost, q.Name, capacity, q.CostRate, q.CostBurst)
	})
	if p != nil {
		return 0, p
	}
	return n, nil
}

// jobCosts is what a job of r costs on each of queue q's budgets (config.Queue.Budgets), in
// their order, or nil for a queue without budgets; each read as jobCost reads the queue's own
// cost. A cost above a budget's capacity is refused with 422, naming the budget.
func jobCosts(q *config.Queue, r *http.Request, body []byte) ([]int64, error) {
	if len(q.Budgets) == 0 {
		return nil, nil
	}
	costs := make([]int64, len(q.Budgets))
	for i, b := range q.Budgets {
		capacity := b.Capacity()
		n, ok := cost.FromRequest(b.Cost, r.Header, r.URL.RawQuery, body)
		if !ok {
			costs[i] = config.Fallback(b.CostFallback, capacity)
			continue
		}
		n, p := checkCost(n, capacity, "queue's budget", func(n int64) string {
			return fmt.Sprintf("this job costs %d units (%s) of budget %q and queue %q delivers at most %d of them at once (cost_rate %s, cost_burst %d)",
				n, b.Cost, b.Name, q.Name, capacity, b.CostRate, b.CostBurst)
		})
		if p != nil {
			return nil, p
		}
		costs[i] = n
	}
	return costs, nil
}
