package worker

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/leaky"
)

// newTestBudget is the unit budget of queue "q" at cfg on a memory schedule.
func newTestBudget(cfg *QueueConfig) *unitBudget {
	sched := leaky.NewMemory(nil)
	slot, _ := newTestSlot(cfg, sched)
	return newUnitBudget(slot.env, sched, slot, &unitLearner{now: time.Now}, nil, context.Background())
}

// TestUnitBudgetAdmit: a job of a unit queue is charged its cost (0: 1; above the capacity,
// the capacity) with its slot, so the leak slot lets it go without another; a queue without
// units charges nothing.
func TestUnitBudgetAdmit(t *testing.T) {
	units := QueueConfig{Name: "q", Rate: leaky.Every(1000, time.Second), Units: leaky.Units{N: 6000, Per: time.Minute}, CostCapacity: 500}
	plain := QueueConfig{Name: "q", Rate: leaky.Every(1000, time.Second)}
	for _, c := range []struct {
		name        string
		cfg         QueueConfig
		cost        int64
		wantCharged bool
		wantCost    int64
	}{
		{"estimate", units, 40, true, 40},
		{"no estimate costs 1", units, 0, true, 1},
		{"above the capacity, the capacity", units, 9000, true, 500},
		{"no units", plain, 40, false, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			u := newTestBudget(&c.cfg)
			j := testJob("j", "")
			j.m.Job.Cost = c.cost
			j.charged = true // from an earlier pass: admit decides anew
			if v := u.admit(context.Background(), &c.cfg, j); v.kind != admitGo {
				t.Fatalf("admit = %+v", v)
			}
			if j.charged != c.wantCharged || j.charge.Cost != c.wantCost {
				t.Fatalf("charged %v %d, want %v %d", j.charged, j.charge.Cost, c.wantCharged, c.wantCost)
			}
		})
	}
	u := newTestBudget(&units)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if v := u.admit(ctx, &units, testJob("x", "")); v.kind != admitRefuse || v.end != endNotSent {
		t.Fatalf("a stopped queue's job: %+v, want refused, not sent", v)
	}
}

// TestUnitBudgetObserve: the answer's true cost is charged or refunded against the estimate;
// a missing one leaves the estimate standing, counted unreconciled; the units delivered count
// the true cost when known.
func TestUnitBudgetObserve(t *testing.T) {
	header := config.Cost{Kind: config.CostHeader, Name: "X-Tokens"}
	for _, c := range []struct {
		name                         string
		from                         config.Cost
		answer                       http.Header
		charge, refund, unrec, deliv float64
		capped                       float64
	}{
		{"more than the estimate", header, http.Header{"X-Tokens": {"70"}}, 30, 0, 0, 70, 0},
		{"less than the estimate", header, http.Header{"X-Tokens": {"15"}}, 0, 25, 0, 15, 0},
		{"as estimated", header, http.Header{"X-Tokens": {"40"}}, 0, 0, 0, 40, 0},
		{"no true cost", header, http.Header{}, 0, 0, 1, 40, 0},
		{"not reconciled", config.Cost{}, http.Header{"X-Tokens": {"70"}}, 0, 0, 0, 40, 0},
		// Owed in full over many periods, up to DebtCapacities capacities (100 × 6000).
		{"many capacities above", header, http.Header{"X-Tokens": {"500000"}}, 499960, 0, 0, 500000, 0},
		{"above the debt cap", header, http.Header{"X-Tokens": {"900000"}}, 600000, 0, 0, 600040, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := QueueConfig{Name: "q", Rate: leaky.Every(1000, time.Second), Units: leaky.Units{N: 6000, Per: time.Minute},
				CostFromResponse: c.from}
			u := newTestBudget(&cfg)
			j := testJob("j", "")
			j.m.Job.Cost = 40
			if v := u.admit(context.Background(), &cfg, j); v.kind != admitGo {
				t.Fatalf("admit = %+v", v)
			}
			u.observe(&cfg, j, answer{resp: &http.Response{StatusCode: 200, Header: c.answer}})
			m := u.env.m
			got := []float64{
				testutil.ToFloat64(m.unitsReconciled.WithLabelValues("q", "charge")),
				testutil.ToFloat64(m.unitsReconciled.WithLabelValues("q", "refund")),
				testutil.ToFloat64(m.unreconciled.WithLabelValues("q")),
				testutil.ToFloat64(m.unitsDelivered.WithLabelValues("q")),
				testutil.ToFloat64(m.debtCapped.WithLabelValues("q")),
			}
			want := []float64{c.charge, c.refund, c.unrec, c.deliv, c.capped}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("charged, refunded, unreconciled, delivered, capped = %v, want %v", got, want)
				}
			}
		})
	}
}
