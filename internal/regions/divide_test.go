package regions

import (
	"math"
	"testing"
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
