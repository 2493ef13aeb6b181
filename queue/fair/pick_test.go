package fair

import (
	"fmt"
	"math"
	"math/rand/v2"
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
				got := picks(p.pick(jobs(s.n), s.rate, t0.Add(s.at)))
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

// jobs is a budget of n jobs and no bound in units.
func jobs(n int) budget { return budget{jobs: n, units: math.Inf(1)} }

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
				for _, pn := range p.pick(jobs(3), c.cap, now) {
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
		for _, pn := range p.pick(jobs(1), 1000, now) {
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
		for _, pn := range p.pick(jobs(3), 0, now, caps) {
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
		for _, pn := range p.pick(jobs(3), 0, now, caps) {
			got[pn.tenant] += pn.n
		}
	}
	// a did not save up turns while held: it gets an even share with b, not a catch-up.
	if d := got["a"] - got["b"]; d < -2 || d > 2 {
		t.Fatalf("after a's hold ended: %v, want a and b even", got)
	}
}

// By units, tenants share units by weight whatever their jobs cost: the picker estimates a
// tenant's next job at its last one's cost and charge corrects its deficit with the true
// costs, random ones included. Each case moves jobs in picks of at most 8 jobs and 400 units
// (a lookahead) until 1 000 000 units have gone, and each tenant's units are its weight's share
// within 1%.
func TestPickUnitShares(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	fixed := func(c int64) func() int64 { return func() int64 { return c } }
	for _, c := range []struct {
		name    string
		costs   map[string]func() int64
		weights map[string]float64
	}{
		{"10x the cost, equal weights", map[string]func() int64{"a": fixed(100), "b": fixed(10)}, nil},
		{"weights 3:1, a's jobs 20x b's", map[string]func() int64{"a": fixed(2000), "b": fixed(100)}, map[string]float64{"a": 3}},
		{"random costs 30-100% of 2000 beside fixed 20", map[string]func() int64{
			"a": func() int64 { return 600 + rng.Int64N(1401) }, "b": fixed(20), "c": fixed(200)}, nil},
		{"a weight under 1", map[string]func() int64{"a": fixed(50), "b": fixed(5)}, map[string]float64{"a": 0.5}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var p picker
			p.setByUnits(true)
			depths := map[string]uint64{}
			for id := range c.costs {
				depths[id] = 1 << 30
			}
			p.update(depths, c.weights)
			got, total := map[string]float64{}, 0.0
			now := time.Unix(0, 0)
			for total < 1_000_000 {
				now = now.Add(time.Millisecond)
				for _, pn := range p.pick(budget{jobs: 8, units: 400}, 0, now) {
					costs := make([]int64, pn.n)
					for i := range costs {
						costs[i] = c.costs[pn.tenant]()
						got[pn.tenant] += float64(costs[i])
						total += float64(costs[i])
					}
					p.charge(pn.tenant, pn.units, costs)
				}
			}
			var sum float64
			for id := range c.costs {
				sum += weightOf(c.weights, id)
			}
			for id := range c.costs {
				want := total * weightOf(c.weights, id) / sum
				if d := got[id] - want; d < -0.01*total || d > 0.01*total {
					t.Errorf("tenant %s got %.0f of %.0f units, want %.0f (±1%%)", id, got[id], total, want)
				}
			}
		})
	}
}

func weightOf(weights map[string]float64, id string) float64 {
	if w, ok := weights[id]; ok {
		return w
	}
	return 1
}

// By units, a visit adds the quantum (the largest cost known) per unit of weight; a tenant is
// estimated at its last job's cost, a new one at the quantum (with none known, at what is left
// of the pick) and gives one job until its cost is known; a job whose true cost was above its
// estimate leaves the tenant owing until later visits pay it; a pick stops once its units are
// spent, the last job allowed to cost more than was left. By jobs, a units bound still holds a
// pick (the lookahead in units), at each tenant's estimate.
func TestPickUnits(t *testing.T) {
	now := time.Unix(0, 0)
	var p picker
	p.setByUnits(true)
	p.update(map[string]uint64{"a": 100, "b": 100}, nil)
	step := func(i int, b budget, want string) {
		t.Helper()
		if got := picks(p.pick(b, 0, now)); got != want {
			t.Fatalf("pick %d (%d jobs, %v units) = %q, want %q", i, b.jobs, b.units, got, want)
		}
	}
	step(1, budget{2, 10}, "a1")    // nothing known: a's job is taken to cost all 10
	p.charge("a", 10, []int64{100}) // a owes 90
	if p.quantum != 100 {
		t.Fatalf("quantum %v, want 100 (a's cost)", p.quantum)
	}
	step(2, budget{1, 1000}, "b1") // b unknown: estimated at 100, one job
	p.charge("b", 100, []int64{10})
	step(3, budget{9, 1000}, "b9") // a: -90+100 < 100, nothing; b: 90+100 at 10 each, cut at 9
	p.charge("b", 90, []int64{10, 10, 10, 10, 10, 10, 10, 10, 10})
	step(4, budget{20, 150}, "b10 a1") // b's visit goes on to its end; a: 10+100, one job
	p.charge("b", 100, []int64{10, 10, 10, 10, 10, 10, 10, 10, 10, 10})
	p.charge("a", 100, []int64{100})
	step(5, budget{10, 1}, "b1") // 1 unit left still lets a job go

	// By jobs, the units bound takes each tenant at its estimate.
	var q picker
	q.update(map[string]uint64{"a": 100, "b": 100}, map[string]float64{"a": 5, "b": 5})
	q.charge("a", 0, []int64{100})
	q.charge("b", 0, []int64{10})
	if got := picks(q.pick(budget{jobs: 100, units: 250}, 0, now)); got != "a3" {
		t.Fatalf("by jobs, 250 units: %q, want a3 (a's 100 each, the last over the bound)", got)
	}
	for i, want := range []string{"a1", "a1", "b3"} { // a's visit of 5 goes on, then b's
		if got := picks(q.pick(budget{jobs: 100, units: 25}, 0, now)); got != want {
			t.Fatalf("by jobs, 25 units, pick %d: %q, want %s", i, got, want)
		}
	}
}

// By units, the tenant rate and holds still cap a tenant: it gives at most one job per
// 1/rate, whatever its deficit.
func TestPickUnitsCapped(t *testing.T) {
	var p picker
	p.setByUnits(true)
	p.update(map[string]uint64{"a": 1 << 20, "b": 1 << 20}, nil)
	got := map[string]int{}
	now := time.Unix(0, 0)
	for range 100 { // 1s at 10ms, a capped at 5/s
		now = now.Add(10 * time.Millisecond)
		for _, pn := range p.pick(budget{jobs: 4, units: 1000}, 0, now, tenantCaps{rates: map[string]float64{"a": 5}}) {
			got[pn.tenant] += pn.n
			costs := make([]int64, pn.n)
			for i := range costs {
				costs[i] = map[string]int64{"a": 10, "b": 100}[pn.tenant]
			}
			p.charge(pn.tenant, pn.units, costs)
		}
	}
	if got["a"] < 4 || got["a"] > 6 || got["b"] < 300 {
		t.Fatalf("1s with a capped at 5/s: %v, want a 5 (±1) and b the rest", got)
	}
}

// TestPickReconciled: by units, a tenant's reported true costs (picker.reconcile) weigh in
// its deficit: a and b declare 10 a job, a's jobs really cost 100. Reported after each pick,
// a gets about one job for b's ten, so each gets about half the true units; a refund gives
// back at most one visit's worth.
func TestPickReconciled(t *testing.T) {
	var p picker
	p.setByUnits(true)
	p.update(map[string]uint64{"a": 1000, "b": 1000}, nil)
	units := map[string]float64{}
	for range 200 {
		for _, pk := range p.pick(budget{jobs: 2, units: math.Inf(1)}, 0, time.Time{}) {
			costs := make([]int64, pk.n)
			for i := range costs {
				costs[i] = 10
			}
			p.charge(pk.tenant, pk.units, costs)
			truth := 10.0
			if pk.tenant == "a" {
				truth = 100
				p.reconcile("a", float64(pk.n)*90)
			}
			units[pk.tenant] += float64(pk.n) * truth
		}
	}
	share := units["a"] / (units["a"] + units["b"])
	t.Logf("true units: a %v, b %v (a %.1f%%)", units["a"], units["b"], 100*share)
	if share < 0.45 || share > 0.55 {
		t.Errorf("a got %.1f%% of the true units, want 50%% ±5%%", 100*share)
	}
	// A refund of 10 000 units gives a one visit's worth in hand at most: its weight × the
	// quantum (10).
	p.reconcile("a", -10_000)
	if d := p.byID["a"].deficit; d > 10 {
		t.Errorf("deficit after a large refund: %v, want at most one visit's worth (10)", d)
	}
	p.reconcile("gone", 50) // a tenant not in the ring: nothing to correct, no panic
}
