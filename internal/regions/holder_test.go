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
// it counted over the last renew period are the demand it reports; a key it does not keep is
// whole.
func TestHolder(t *testing.T) {
	srv := testenv.NATS(t)
	js, err := jetstream.New(testenv.Connect(t, srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Now().Truncate(time.Second) // on a boundary of the demand's slots
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	ctx := context.Background()
	terms := Terms{Lease: 2 * time.Second, Renew: 500 * time.Millisecond, Hold: time.Nanosecond}
	h := NewHolder(NewCoordinator(js, "a", clock), terms, func(b float64) float64 { return b / 2 }, nil)
	h.Set(map[string]float64{"rule.x": 20})
	if f := h.Fraction("rule.x"); f != 0.5 {
		t.Fatalf("before a lease: %v, want the safe share's 0.5", f)
	}
	// What the metrics show: on the safe share from the start, lost only after a lease and a
	// renew period without one.
	held := func() Held {
		ls := h.Leases()
		if len(ls) != 1 || ls[0].Key != "rule.x" {
			t.Fatalf("Leases %+v; want rule.x alone", ls)
		}
		return ls[0]
	}
	if l := held(); !l.OnSafe || l.Lost || l.Share != 10 || !l.Expires.IsZero() {
		t.Fatalf("before a lease: %+v; want on the safe share (10), not lost, no expiry", l)
	}
	// Another holder, on a clock of its own, that never gets a lease: lost once a lease and a
	// renew period passed since it began keeping the budget, not before.
	since := clock()
	later := since
	h2 := NewHolder(NewCoordinator(js, "c", func() time.Time { return later }), terms, func(float64) float64 { return 0 }, nil)
	h2.Set(map[string]float64{"rule.y": 20})
	later = since.Add(terms.Lease + terms.Renew)
	if ls := h2.Leases(); len(ls) != 1 || !ls[0].OnSafe || ls[0].Lost {
		t.Fatalf("a lease and a renew period without one: %+v; on the safe share, not lost yet (the threshold is exceeded, not met)", ls)
	}
	later = later.Add(time.Millisecond)
	if ls := h2.Leases(); len(ls) != 1 || !ls[0].Lost {
		t.Fatalf("past a lease and a renew period without one: %+v; want lost", ls)
	}
	if f := h.Fraction("rule.other"); f != 1 {
		t.Fatalf("a key it does not keep: %v, want 1", f)
	}
	for range 9 { // 10 decisions with the one above
		h.Fraction("rule.x")
	}
	demand := func() float64 {
		rec, _, err := Read(ctx, js, "rule.x")
		if err != nil {
			t.Fatal(err)
		}
		return rec.Leases["a"].Demand
	}
	h.renew(ctx) // makes the record, held for a nanosecond
	if d := demand(); d != 20 {
		t.Fatalf("first renewal's demand %v; want 20 (10 decisions in the last renew period, 0.5 s)", d)
	}
	advance(terms.Renew / 4)
	h.renew(ctx)
	rec, ok, err := Read(ctx, js, "rule.x")
	if err != nil || !ok || rec.Leases["a"].Share != 20 {
		t.Fatalf("record %+v %v %v; want a's lease of the whole budget", rec, ok, err)
	}
	if f := h.Fraction("rule.x"); f != 1 {
		t.Fatalf("on its lease of the whole budget: %v, want 1", f)
	}
	if l := held(); l.OnSafe || l.Lost || l.Share != 20 || !l.Expires.Equal(clock().Add(terms.Lease)) {
		t.Fatalf("on its lease: %+v; want share 20 until a lease from now, not on the safe share", l)
	}
	// A quarter period later the first 10 decisions are still within the window.
	if d := demand(); d != 20 {
		t.Errorf("second renewal's demand %v, want 20 (10 decisions in the last 0.5 s)", d)
	}
	advance(terms.Renew) // the first 10 decisions leave the window, the 11th stays
	h.renew(ctx)
	if d := demand(); d != 2 {
		t.Errorf("third renewal's demand %v, want 2 (one decision in 0.5 s)", d)
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
	// The episode starts at the lease's expiry, not at the holder's start.
	if l := held(); !l.OnSafe || l.Lost || l.Share != 20 {
		t.Errorf("just past the lease: %+v; want on the safe share (20 of 40), not lost", l)
	}
	advance(terms.Lease + terms.Renew + time.Millisecond)
	if l := held(); !l.Lost {
		t.Errorf("a lease and a renew period past the lease: %+v; want lost", l)
	}
}

// TestDemandChanged: a holder renews before its period ends when the decisions' rate fell
// below half the demand it reported, or rose above twice it, beyond 1% of the budget.
func TestDemandChanged(t *testing.T) {
	for _, tc := range []struct {
		rate, reported, budget float64
		want                   bool
	}{
		{0, 10, 16, true}, {6, 10, 16, false}, {4.8, 10, 16, true}, {21, 10, 16, true}, {19, 10, 16, false},
		{0.1, 0, 16, false}, {1, 0, 16, true},
	} {
		if got := demandChanged(tc.rate, tc.reported, tc.budget); got != tc.want {
			t.Errorf("rate %v, reported %v, budget %v: %v, want %v", tc.rate, tc.reported, tc.budget, got, tc.want)
		}
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
		h.renew(ctx)
		got, _, ok := h.Limit("rule.x", spec)
		return ok && got.Limit == 10
	})
}
