package worker_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/queue"
)

// TestUnitChargeOwed (issue 39): a queue with a unit budget on a real Redis, jobs charged 100
// units that cost 600. Redis is SIGSTOPped while the first answer is on its way, so its extra
// charge of 500 fails; it is kept (sluice_queue_owed_charges_total{result="kept"}), and made
// once Redis is SIGCONTed and a later delivery's take succeeded ("paid"). Every job's extra
// 500 is charged exactly once — the one whose call reached the stopped server and ran when it
// resumed is not charged again — so the units reconciled are 3 × 500 and nothing stays owed.
// Before, the failed charge was dropped: 1000.
func TestUnitChargeOwed(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "owed"})
	rs := testenv.Redis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr, MaxRetries: -1,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	sched := leaky.NewRedis(rdb, leaky.RedisConfig{Prefix: testenv.Name(t) + ":"})
	var n atomic.Int64
	h.up.Respond(func(a workertest.Arrival, _ int) workertest.Reply {
		if n.Add(1) == 1 {
			rs.Pause() // the answer's charge will find Redis stopped
		}
		return workertest.Reply{Body: []byte(`{"usage":{"total":600}}`)}
	})
	spec := h.spec("owed", 100)
	spec.Units = leaky.Units{N: 1000, Per: time.Second}
	spec.CostCapacity = 1000
	spec.CostFromResponse = config.Cost{Kind: config.CostJSON, Name: "/usage/total"}
	publishCost(t, h.qs, "owed", 3, 100)
	r := h.run(worker.Deps{Schedule: sched}, spec)

	testenv.WaitFor(t, 10*time.Second, "the failed charge kept", func() bool {
		return metric(t, r.reg, "sluice_queue_owed_charges_total", "queue", "owed", "result", "kept") >= 1
	})
	if got := metric(t, r.reg, "sluice_queue_owed_charges", "queue", "owed"); got < 1 {
		t.Errorf("owed charges kept now = %v, want ≥ 1 while Redis is stopped", got)
	}
	rs.Resume()
	testenv.WaitFor(t, 20*time.Second, "3 jobs delivered and every owed charge paid", func() bool {
		return h.up.Distinct() >= 3 &&
			metric(t, r.reg, "sluice_queue_owed_charges", "queue", "owed") == 0 &&
			metric(t, r.reg, "sluice_units_delivered_total", "queue", "owed") >= 3*600
	})
	kept := metric(t, r.reg, "sluice_queue_owed_charges_total", "queue", "owed", "result", "kept")
	paid := metric(t, r.reg, "sluice_queue_owed_charges_total", "queue", "owed", "result", "paid")
	charged := metric(t, r.reg, "sluice_units_reconciled_total", "queue", "owed", "direction", "charge")
	t.Logf("owed charges: %v kept, %v paid; units charged on reconciliation %v (3 jobs × 500)", kept, paid, charged)
	if paid != kept {
		t.Errorf("%v owed charges paid, want all %v kept", paid, kept)
	}
	if charged != 3*500 {
		t.Errorf("units charged on reconciliation = %v, want 1500 (each job's 500, once)", charged)
	}
}

// TestBudgetChargeOwed (issue 39): the same for a queue with budgets (input and output), jobs
// charged 100 of each whose answers report 100 input and 600 output units. The first answer's
// output charge of 500 finds Redis stopped: it is kept under its budget
// (sluice_queue_owed_charges_total{queue="owed/output",result="kept"}), made once Redis is
// SIGCONTed and a later delivery's take succeeded ("paid"), and made once in all: the output
// units reconciled are 3 × 500. Before, a budget's failed charge was counted and dropped.
func TestBudgetChargeOwed(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "owed"})
	rs := testenv.Redis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr, MaxRetries: -1,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	sched := leaky.NewRedis(rdb, leaky.RedisConfig{Prefix: testenv.Name(t) + ":"})
	var n atomic.Int64
	h.up.Respond(func(a workertest.Arrival, _ int) workertest.Reply {
		if n.Add(1) == 1 {
			rs.Pause() // the answer's charges will find Redis stopped
		}
		return workertest.Reply{Body: []byte(`{"usage":{"input":100,"output":600}}`)}
	})
	spec := h.spec("owed", 100)
	spec.Budgets = []worker.Budget{
		{Name: "input", Units: leaky.Units{N: 1000, Per: time.Second}, Capacity: 1000,
			CostFromResponse: config.Cost{Kind: config.CostJSON, Name: "/usage/input"}},
		{Name: "output", Units: leaky.Units{N: 1000, Per: time.Second}, Capacity: 1000,
			CostFromResponse: config.Cost{Kind: config.CostJSON, Name: "/usage/output"}},
	}
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := h.qs.Publish(ctx, &queue.Job{Queue: "owed", Direct: true, Costs: []int64{100, 100}, Body: []byte("x")})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	r := h.run(worker.Deps{Schedule: sched}, spec)

	testenv.WaitFor(t, 10*time.Second, "the failed output charge kept", func() bool {
		return metric(t, r.reg, "sluice_queue_owed_charges_total", "queue", "owed/output", "result", "kept") >= 1
	})
	if got := metric(t, r.reg, "sluice_queue_owed_charges", "queue", "owed"); got < 1 {
		t.Errorf("owed charges kept now = %v, want ≥ 1 while Redis is stopped", got)
	}
	rs.Resume()
	testenv.WaitFor(t, 20*time.Second, "3 jobs delivered and every owed charge paid", func() bool {
		return h.up.Distinct() >= 3 &&
			metric(t, r.reg, "sluice_queue_owed_charges", "queue", "owed") == 0 &&
			metric(t, r.reg, "sluice_units_delivered_total", "queue", "owed/output") >= 3*600
	})
	kept := metric(t, r.reg, "sluice_queue_owed_charges_total", "queue", "owed/output", "result", "kept")
	paid := metric(t, r.reg, "sluice_queue_owed_charges_total", "queue", "owed/output", "result", "paid")
	charged := metric(t, r.reg, "sluice_units_reconciled_total", "queue", "owed/output", "direction", "charge")
	t.Logf("output owed charges: %v kept, %v paid; output units charged on reconciliation %v (3 jobs × 500)", kept, paid, charged)
	if paid != kept {
		t.Errorf("%v owed charges paid, want all %v kept", paid, kept)
	}
	if charged != 3*500 {
		t.Errorf("output units charged on reconciliation = %v, want 1500 (each job's 500, once)", charged)
	}
	if got := metric(t, r.reg, "sluice_units_reconciled_total", "queue", "owed/input", "direction", "charge"); got != 0 {
		t.Errorf("input units charged on reconciliation = %v, want 0 (the answers report the charge)", got)
	}
}
