package fair

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// The round robin's rules, one row each: a row starts from depths (and weights, and a cap),
// then takes its steps in order, each an optional change of the backlogs and one pick at an
// instant after t0.
func TestPick(t *testing.T) {
	type step struct {
		update map[string]uint64 // non-nil: the backlogs are reread first, with these depths
		empty  string            // non-empty: a read found this tenant's backlog empty first
		at     time.Duration     // the pick's instant, after t0
		n      int               // jobs wanted
		rate   float64           // the tenant rate cap; 0: none
		want   string            // jobs per tenant, in the order first chosen: "a3 b1"
		due    time.Duration     // when, after t0, the first tenant its cap held back is due; 0: none
	}
	deep := map[string]uint64{"a": 10, "b": 10, "c": 10}
	for _, c := range []struct {
		name    string
		depths  map[string]uint64
		weights map[string]float64
		steps   []step
	}{
		{name: "equal weights take turns", depths: deep, steps: []step{
			{n: 3, want: "a1 b1 c1"}, {n: 4, want: "a2 b1 c1"}, {n: 2, want: "b1 c1"},
		}},
		{name: "weights are honoured", depths: deep, weights: map[string]float64{"a": 3, "c": 2}, steps: []step{
			{n: 6, want: "a3 b1 c2"}, {n: 6, want: "a3 b1 c2"},
		}},
		{name: "a weight absent or not above 0 is 1", depths: deep, weights: map[string]float64{"a": 0, "b": -2, "c": 2}, steps: []step{
			{n: 4, want: "a1 b1 c2"},
		}},
		{name: "a fractional weight saves its turns up", depths: map[string]uint64{"a": 10, "b": 10}, weights: map[string]float64{"a": 0.5}, steps: []step{
			{n: 1, want: "b1"}, {n: 1, want: "a1"}, {n: 1, want: "b1"}, {n: 1, want: "b1"}, {n: 1, want: "a1"},
		}},
		{name: "a turn cut short goes on next time, deficit carried over", depths: deep, weights: map[string]float64{"a": 3}, steps: []step{
			{n: 2, want: "a2"}, {n: 3, want: "a1 b1 c1"},
		}},
		{name: "empty tenants are skipped", depths: map[string]uint64{"a": 1, "b": 5}, steps: []step{
			{n: 4, want: "a1 b3"}, {n: 4, want: "b2"}, {n: 4, want: ""},
		}},
		{name: "a tenant a read found empty gives nothing until reread", depths: deep, steps: []step{
			{empty: "a", n: 3, want: "b2 c1"},
			{update: deep, n: 3, want: "c1 a1 b1"},
		}},
		{name: "no tenants, no jobs", depths: map[string]uint64{}, steps: []step{{n: 3, want: ""}}},
		{name: "new tenants join at the end, in sorted order", depths: map[string]uint64{"a": 10, "b": 10}, steps: []step{
			{n: 1, want: "a1"},
			{update: map[string]uint64{"a": 10, "b": 10, "c": 10, "aa": 10}, n: 5, want: "b2 aa1 c1 a1"},
		}},
		{name: "a tenant gone from the backlogs leaves, the others keep their turn", depths: deep, steps: []step{
			{n: 2, want: "a1 b1"},
			{update: map[string]uint64{"b": 10, "c": 10}, n: 2, want: "c1 b1"},
		}},
		{name: "a reread depth replaces the picked-down one", depths: map[string]uint64{"a": 1}, steps: []step{
			{n: 3, want: "a1"}, {n: 3, want: ""}, {update: map[string]uint64{"a": 2}, n: 3, want: "a2"},
		}},
		{name: "the tenant rate caps each tenant, and says when the next is due", depths: deep, steps: []step{
			{n: 5, rate: 10, want: "a1 b1 c1", due: 100 * time.Millisecond},
			{at: 50 * time.Millisecond, n: 5, rate: 10, want: "", due: 100 * time.Millisecond},
			{at: 100 * time.Millisecond, n: 5, rate: 10, want: "c1 a1 b1", due: 200 * time.Millisecond},
		}},
		{name: "a capped tenant does not save up turns", depths: map[string]uint64{"a": 10, "b": 10}, weights: map[string]float64{"a": 3}, steps: []step{
			{n: 4, rate: 10, want: "a1 b1", due: 100 * time.Millisecond}, // a held back with 2 of its 3 left
			{n: 1, want: "b1"},
			{n: 3, want: "a3"}, // a fresh turn of 3, not 2 saved + 3
		}},
		{name: "an emptied tenant does not save up turns", depths: map[string]uint64{"a": 1, "b": 10}, weights: map[string]float64{"a": 3}, steps: []step{
			{n: 2, want: "a1 b1"}, // a emptied with 2 of its 3 left
			{update: map[string]uint64{"a": 10, "b": 10}, n: 3, want: "a3"},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t0 := time.Unix(1_800_000_000, 0)
			var p picker
			p.update(c.depths, c.weights)
			for i, s := range c.steps {
				if s.update != nil {
					p.update(s.update, c.weights)
				}
				if s.empty != "" {
					p.empty(s.empty)
				}
				got := picks(p.pick(s.n, s.rate, t0.Add(s.at)))
				if got != s.want {
					t.Errorf("step %d: pick(%d) = %q, want %q", i, s.n, got, s.want)
				}
				var due time.Duration
				if !p.nextDue.IsZero() {
					due = p.nextDue.Sub(t0)
				}
				if due != s.due {
					t.Errorf("step %d: next due at t0+%v, want t0+%v", i, due, s.due)
				}
			}
		})
	}
}

func picks(ps []pickN) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = fmt.Sprint(p.tenant, p.n)
	}
	return strings.Join(s, " ")
}

// Over many picks each tenant gets its weight's share, fractional weights and caps included.
func TestPickShares(t *testing.T) {
	for _, c := range []struct {
		name    string
		weights map[string]float64
		cap     float64
		want    map[string]int // jobs of 1200 picks
	}{
		{"equal", nil, 0, map[string]int{"a": 400, "b": 400, "c": 400}},
		{"weighted", map[string]float64{"a": 3, "b": 2}, 0, map[string]int{"a": 600, "b": 400, "c": 200}},
		{"half", map[string]float64{"a": 0.5}, 0, map[string]int{"a": 240, "b": 480, "c": 480}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var p picker
			p.update(map[string]uint64{"a": 1 << 20, "b": 1 << 20, "c": 1 << 20}, c.weights)
			got := map[string]int{}
			now := time.Unix(0, 0)
			for range 400 {
				now = now.Add(time.Millisecond)
				for _, pn := range p.pick(3, c.cap, now) {
					got[pn.tenant] += pn.n
				}
			}
			for id, w := range c.want {
				if d := got[id] - w; d < -3 || d > 3 {
					t.Errorf("tenant %s got %d of 1200, want %d", id, got[id], w)
				}
			}
		})
	}
}

// A tenant of weight under 1 still comes round under a cap that does not hold it back: its
// turns add up until it has a whole job (a cap once spent the turn and cleared it).
func TestPickFractionalWeightUnderCap(t *testing.T) {
	var p picker
	p.update(map[string]uint64{"a": 1 << 20, "b": 1 << 20}, map[string]float64{"a": 0.5, "b": 1})
	got := map[string]int{}
	now := time.Unix(0, 0)
	for range 300 {
		now = now.Add(10 * time.Millisecond) // a cap of 1000/s never holds a tenant back here
		for _, pn := range p.pick(1, 1000, now) {
			got[pn.tenant] += pn.n
		}
	}
	if got["a"] < 95 || got["a"] > 105 || got["b"] < 195 || got["b"] > 205 {
		t.Errorf("got %v of 300, want a 100 and b 200 (weights 0.5 and 1)", got)
	}
}

// A held tenant gives nothing while it is held and saves up no turns; the others share what it
// leaves. A tenant's own rate replaces the queue's for it alone.
func TestPickTenantCaps(t *testing.T) {
	var p picker
	p.update(map[string]uint64{"a": 1 << 20, "b": 1 << 20, "c": 1 << 20}, nil)
	heldA := true
	caps := tenantCaps{held: func(id string) bool { return heldA && id == "a" }, rates: map[string]float64{"c": 10}}
	got := map[string]int{}
	now := time.Unix(0, 0)
	for range 100 { // 1s at 10ms: b uncapped, c at 10/s
		now = now.Add(10 * time.Millisecond)
		for _, pn := range p.pick(3, 0, now, caps) {
			got[pn.tenant] += pn.n
		}
	}
	if got["a"] != 0 || got["c"] > 11 || got["b"] < 280 {
		t.Fatalf("while a is held: %v of 300, want a 0, c at most 11 (10/s), b the rest", got)
	}
	heldA = false
	clear(got)
	for range 100 {
		now = now.Add(10 * time.Millisecond)
		for _, pn := range p.pick(3, 0, now, caps) {
			got[pn.tenant] += pn.n
		}
	}
	// a did not save up turns while held: it gets an even share with b, not a catch-up.
	if d := got["a"] - got["b"]; d < -2 || d > 2 {
		t.Fatalf("after a's hold ended: %v, want a and b even", got)
	}
}
