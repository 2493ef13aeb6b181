package fair

import (
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/sluice-rl/sluice/queue"
)

// Reconciled costs.
//
// By units (Options.ByUnits) a job is counted at its Job.Cost, the estimate read at
// acceptance, as it is moved. A worker that reads the job's true cost from its answer
// (cost_from_response) reports the difference with ReportCost, on the queue's core NATS subject
// (queue.FairLayout.CostSubject). Every process's scheduler listens; the leader takes the
// differences into the tenants' deficits at its next round, so a tenant whose jobs cost more
// than declared owes the rest and gives fewer jobs until it is paid, and one whose jobs cost
// less gets the difference back, up to one visit's worth in hand. Tenants then share the true
// units by weight, not the declared ones, to within what is in flight before the answers: the
// lookahead and the jobs the workers hold.
//
// Reports are at most once and cost one small core NATS message per reconciled job. One lost
// (NATS reconnecting, a scheduler starting) leaves that job counted at its estimate, as
// without reports; reports of a tenant that left the ring (no jobs waiting) are dropped, as
// deficit round robin drops a leaving tenant's deficit; a new leader starts without the
// reports its predecessor had not applied.

// ReportCost reports that a job of tenant on the fair queue of layout l cost delta units more
// than its Job.Cost (less when delta < 0; a Job.Cost of 0 counts 1), for its scheduler's
// deficits by units. It publishes one core NATS message and does not wait for the server.
func ReportCost(l queue.FairLayout, tenant string, delta int64) error {
	if delta == 0 {
		return nil
	}
	b := strconv.AppendInt(make([]byte, 0, 24+len(tenant)), delta, 10)
	b = append(append(b, ' '), tenant...)
	return l.JetStream.Conn().Publish(l.CostSubject(), b)
}

// reports sums the cost reports a scheduler heard, per tenant, until its next round takes
// them. Safe for concurrent use; the zero value is ready.
type reports struct {
	mu sync.Mutex
	by map[string]int64
}

// heard adds one report (ReportCost's message); a malformed one is ignored.
func (r *reports) heard(m *nats.Msg) {
	d, tenant, ok := strings.Cut(string(m.Data), " ")
	delta, err := strconv.ParseInt(d, 10, 64)
	if !ok || err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.by == nil {
		r.by = map[string]int64{}
	}
	r.by[tenant] += delta
}

// take returns the reports heard since the last take, per tenant, and forgets them.
func (r *reports) take() map[string]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	by := r.by
	r.by = nil
	return by
}

// reconcile takes delta units more (< 0: fewer) of tenant id's jobs moved than were counted
// into its deficit, by units: it owes them, or gets them back up to one visit's worth in hand.
// A tenant not in the ring has no deficit to correct.
func (p *picker) reconcile(id string, delta float64) {
	t, ok := p.byID[id]
	if !ok || !p.byUnits {
		return
	}
	d := t.deficit - delta
	if delta < 0 {
		d = min(d, max(t.deficit, t.weight*p.quantum))
	}
	t.deficit = d
}
