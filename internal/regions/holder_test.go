package regions

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/limit"
)

// TestHolder: a holder's fraction of a budget is its safe share's before the first lease, its
// lease's share after, its safe share's again once the lease expired unrenewed; the decisions
// it counted are the demand it reports, for two renewals; a key it does not keep is whole.
func TestHolder(t *testing.T) {
	srv := testenv.NATS(t)
	js, err := jetstream.New(testenv.Connect(t, srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	ctx := context.Background()
	terms := Terms{Lease: 2 * time.Second, Renew: 500 * time.Millisecond, Hold: time.Nanosecond}
	h := NewHolder(NewCoordinator(js, "a", clock), terms, func(b float64) float64 { return b / 2 }, nil)
	h.Set(map[string]float64{"rule.x": 20})
	if f := h.Fraction("rule.x"); f != 0.5 {
		t.Fatalf("before a lease: %v, want the safe share's 0.5", f)
	}
	if f := h.Fraction("rule.other"); f != 1 {
		t.Fatalf("a key it does not keep: %v, want 1", f)
	}
	for range 9 { // 10 decisions with the one above
		h.Fraction("rule.x")
	}
	h.renew(ctx, time.Second) // makes the record, held for a nanosecond
	if rec, _, err := Read(ctx, js, "rule.x"); err != nil || rec.Leases["a"].Demand != 10 {
		t.Fatalf("first renewal: %+v %v; want demand 10 (10 decisions in 1 s)", rec.Leases["a"], err)
	}
	advance(time.Millisecond)
	h.renew(ctx, time.Second)
	rec, ok, err := Read(ctx, js, "rule.x")
	if err != nil || !ok || rec.Leases["a"].Share != 20 {
		t.Fatalf("record %+v %v %v; want a's lease of the whole budget", rec, ok, err)
	}
	if f := h.Fraction("rule.x"); f != 1 {
		t.Fatalf("on its lease of the whole budget: %v, want 1", f)
	}
	// The demand reported is the larger of the last two periods' rates: the first period's
	// 10/s once more (a one-renewal pause does not give the share away), then the one decision
	// counted since (the Fraction above) per second.
	if d := rec.Leases["a"].Demand; d != 10 {
		t.Errorf("second renewal's demand %v, want 10 (the period before's)", d)
	}
	advance(time.Millisecond)
	h.renew(ctx, time.Second)
	if rec, _, err := Read(ctx, js, "rule.x"); err != nil || rec.Leases["a"].Demand != 1 {
		t.Errorf("third renewal's demand %v %v, want 1 (one decision in its period, none in the one before)", rec.Leases["a"].Demand, err)
	}
	// The budget changes (a reload): the lease stays until the next renewal, its fraction of the new one.
	h.Set(map[string]float64{"rule.x": 40})
	if f := h.Fraction("rule.x"); f != 0.5 {
		t.Errorf("after the budget doubled: %v, want 0.5 until the next renewal", f)
	}
	advance(terms.Lease)
	if f := h.Fraction("rule.x"); f != 0.5 {
		t.Errorf("the lease expired: %v, want the safe share's 0.5", f)
	}
}

// TestHolderStrictSafeShare: with a safe share of 0 (a strict budget) a holder without a lease
// cuts a global rule's limit to nothing: Limit refuses, with a wait of at most a renew period,
// and still counts the decision as demand; on a lease of half the budget it cuts to half.
func TestHolderStrictSafeShare(t *testing.T) {
	srv := testenv.NATS(t)
	js, err := jetstream.New(testenv.Connect(t, srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	terms := Terms{Lease: 2 * time.Second, Renew: 500 * time.Millisecond, Hold: time.Nanosecond}
	h := NewHolder(NewCoordinator(js, "a", nil), terms, func(float64) float64 { return 0 }, nil)
	h.Set(map[string]float64{"rule.x": 20})
	spec := limit.Limit{Algorithm: limit.FixedWindow, Limit: 20, Period: time.Second}
	if got, wait, ok := h.Limit("rule.x", spec); ok || got.Limit != 0 || wait <= 0 || wait > terms.Renew {
		t.Fatalf("no lease, safe share 0: limit %d wait %v ok %v; want refused for at most %v", got.Limit, wait, ok, terms.Renew)
	}
	if got, _, ok := h.Limit("rule.other", spec); !ok || got != spec {
		t.Fatalf("a key it does not keep: %+v %v; want the whole limit", got, ok)
	}
	// Region b holds half; a's renewals (the first makes the record) get the other half.
	ctx := context.Background()
	bt := terms
	bt.Budget = 20
	b := NewCoordinator(js, "b", nil)
	if _, _, err := b.Renew(ctx, "rule.x", 100, bt, nil); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "a on a lease of half the budget: a limit of 10", func() bool {
		_, _, _ = b.Renew(ctx, "rule.x", 100, bt, nil)
		for range 30 { // a demand of 30/s: more than half the budget
			h.Limit("rule.x", spec)
		}
		h.renew(ctx, time.Second)
		got, _, ok := h.Limit("rule.x", spec)
		return ok && got.Limit == 10
	})
}
