package regions

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// TestHolder: a holder's fraction of a budget is its safe share's before the first lease, its
// lease's share after, its safe share's again once the lease expired unrenewed; the decisions
// it counted are the demand it reports; a key it does not keep is whole.
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
	// The demand reported is the decisions counted over the period: 1 since the last renewal.
	if d := rec.Leases["a"].Demand; d != 0 {
		t.Errorf("second renewal's demand %v, want 0 (the 10 decisions went with the first)", d)
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
