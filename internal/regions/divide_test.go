package regions

import (
	"math"
	"testing"
	"time"
)

func TestDivide(t *testing.T) {
	for _, tc := range []struct {
		name    string
		budget  float64
		demand  map[string]float64
		minimum float64
		want    map[string]float64
	}{
		{"both over: even", 50, map[string]float64{"a": 900, "b": 100}, 0, map[string]float64{"a": 25, "b": 25}},
		{"one small: the other takes the rest", 50, map[string]float64{"a": 900, "b": 10}, 0, map[string]float64{"a": 40, "b": 10}},
		{"minimum for an idle region", 50, map[string]float64{"a": 900, "b": 0}, 2, map[string]float64{"a": 48, "b": 2}},
		{"under budget: the rest spread", 50, map[string]float64{"a": 20, "b": 10}, 0, map[string]float64{"a": 30, "b": 20}},
		{"minimums above budget: even", 10, map[string]float64{"a": 100, "b": 100, "c": 0}, 5, map[string]float64{"a": 10.0 / 3, "b": 10.0 / 3, "c": 10.0 / 3}},
		{"three, max-min", 90, map[string]float64{"a": 10, "b": 100, "c": 100}, 0, map[string]float64{"a": 10, "b": 40, "c": 40}},
		{"negative and NaN demand count as none", 10, map[string]float64{"a": -5, "b": math.NaN(), "c": 100}, 0, map[string]float64{"a": 0, "b": 0, "c": 10}},
		{"no budget", 0, map[string]float64{"a": 5}, 1, map[string]float64{"a": 0}},
		{"one region", 50, map[string]float64{"a": 1}, 0, map[string]float64{"a": 50}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Divide(tc.budget, tc.demand, tc.minimum)
			sum := 0.0
			for r, w := range tc.want {
				if math.Abs(got[r]-w) > 1e-9 {
					t.Errorf("%s: share %v, want %v (all: %v)", r, got[r], w, got)
				}
				sum += got[r]
			}
			if len(got) != len(tc.want) {
				t.Errorf("regions %v, want %v", got, tc.want)
			}
			if sum > tc.budget+1e-9 {
				t.Errorf("shares sum to %v, over the budget %v", sum, tc.budget)
			}
		})
	}
}

// TestRenewNeverOverBudget renews in turns with shifting demands and checks, at every step,
// that what the regions hold never exceeds the budget, and that shares follow demand within
// two renewals.
func TestRenewNeverOverBudget(t *testing.T) {
	terms := Terms{Budget: 50, Lease: 10 * time.Second, Renew: time.Second, Lingers: 500 * time.Millisecond}
	t0 := time.Unix(1_000_000, 0)
	rec := Fresh(terms, t0)
	now := t0
	renew := func(region string, demand float64) Lease {
		var l Lease
		rec, l = Renew(rec, region, demand, terms, now)
		if h := rec.Held(now); h > terms.Budget+1e-9 {
			t.Fatalf("at %v: held %v > budget", now.Sub(t0), h)
		}
		return l
	}
	// Held: a fresh record hands out nothing for a lease period.
	if l := renew("a", 100); l.Share != 0 || l.Expires.After(now) {
		t.Fatalf("fresh record gave %+v", l)
	}
	now = now.Add(terms.Lease)
	var la, lb Lease
	for range 4 { // a alone first; b gets its part once a's lowered share stopped lingering
		la, lb = renew("a", 100), renew("b", 100)
		now = now.Add(terms.Renew)
	}
	if la.Share != 25 || lb.Share != 25 {
		t.Fatalf("both busy: %v, %v; want 25 each", la.Share, lb.Share)
	}
	// B's demand falls: A gets the rest within two renewals (B's lowered share lingers).
	for i := range 3 {
		la, lb = renew("a", 100), renew("b", 0)
		now = now.Add(terms.Renew)
		t.Logf("renewal %d: a %.1f b %.1f held %.1f", i, la.Share, lb.Share, rec.Held(now))
	}
	if la.Share != 50 || lb.Share != 0 {
		t.Fatalf("after the shift: %v, %v; want 50, 0", la.Share, lb.Share)
	}
	// B goes silent and its demand returns: A keeps its lease; B's lease expired, so B's renewal
	// gets only what A does not hold until A renews lower.
	for range 11 { // b silent for longer than its lease; a renews
		la = renew("a", 100)
		now = now.Add(terms.Renew)
	}
	lb = renew("b", 100)
	if lb.Share != 0 {
		t.Fatalf("b got %v while a holds the whole budget", lb.Share)
	}
	la = renew("a", 100)
	// b's renewal while a's former share lingers gets nothing, and says when that ends.
	now = now.Add(terms.Renew * 3 / 4)
	if lb = renew("b", 100); lb.Share != 0 || !lb.Retry.Equal(la.WasUntil) {
		t.Fatalf("b while a's share lingers: %+v; want share 0, retry at %v", lb, la.WasUntil)
	}
	now = lb.Retry
	lb = renew("b", 100)
	if la.Share != 25 || lb.Share != 25 || !lb.Retry.IsZero() {
		t.Fatalf("after b's return: %v, %+v; want 25 each, no retry", la.Share, lb)
	}
}
