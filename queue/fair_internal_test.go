package queue

import (
	"testing"
	"time"
)

// The round robin gives each tenant its weight's share, fractional weights and caps included.
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
			f := &Fair{byID: map[string]*tenant{}}
			for _, id := range []string{"a", "b", "c"} {
				tn := &tenant{id: id, depth: 1 << 20, weight: 1}
				if w, ok := c.weights[id]; ok {
					tn.weight = w
				}
				f.ring, f.byID[id] = append(f.ring, tn), tn
			}
			got := map[string]int{}
			now := time.Unix(0, 0)
			for range 400 {
				now = now.Add(time.Millisecond)
				for _, p := range f.pick(3, FairOptions{TenantRate: c.cap}, now) {
					got[p.t.id] += p.n
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
	f := &Fair{byID: map[string]*tenant{}}
	for id, w := range map[string]float64{"a": 0.5, "b": 1} {
		tn := &tenant{id: id, depth: 1 << 20, weight: w}
		f.ring, f.byID[id] = append(f.ring, tn), tn
	}
	got := map[string]int{}
	now := time.Unix(0, 0)
	for range 300 {
		now = now.Add(10 * time.Millisecond) // a cap of 1000/s never holds a tenant back here
		for _, p := range f.pick(1, FairOptions{TenantRate: 1000}, now) {
			got[p.t.id] += p.n
		}
	}
	if got["a"] < 95 || got["a"] > 105 || got["b"] < 195 || got["b"] > 205 {
		t.Errorf("got %v of 300, want a 100 and b 200 (weights 0.5 and 1)", got)
	}
}
