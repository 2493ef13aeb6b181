package regions

import (
	"math"
	"slices"
)

// Divide splits budget between regions by max-min fair division of their demands, each
// region first given its minimum: a region asking for less than an even part of what is left
// gets all it asks for, and the rest is split again among the others, until every region is
// satisfied or the budget is spent. What no demand takes is spread evenly over all regions,
// so that a region whose demand grows before its next renewal can use it.
//
// Guarantees: the shares never sum to more than budget (minimums included: when the
// minimums alone exceed it, each region gets an even part instead); every share is ≥ 0; a
// region gets at least min(minimum, budget/len(demand)); the result does not depend on the
// map's order. Demands below zero count as zero. A non-positive budget gives every region 0.
func Divide(budget float64, demand map[string]float64, minimum float64) map[string]float64 {
	out := make(map[string]float64, len(demand))
	n := len(demand)
	if n == 0 {
		return out
	}
	if budget <= 0 || math.IsNaN(budget) {
		for r := range demand {
			out[r] = 0
		}
		return out
	}
	minimum = max(0, min(minimum, budget/float64(n)))
	names := make([]string, 0, n)
	for r := range demand {
		names = append(names, r)
		out[r] = minimum
	}
	left := budget - minimum*float64(n)
	// Each region wants what its demand asks beyond its minimum; the smallest wants first.
	want := func(r string) float64 {
		d := demand[r]
		if math.IsNaN(d) || d < 0 {
			d = 0
		}
		return max(0, d-minimum)
	}
	slices.SortFunc(names, func(a, b string) int {
		if c := cmpFloat(want(a), want(b)); c != 0 {
			return c
		}
		if a < b {
			return -1
		}
		return 1
	})
	for i, r := range names {
		part := left / float64(n-i)
		give := min(want(r), part)
		out[r] += give
		left -= give
	}
	if left > 0 {
		for _, r := range names {
			out[r] += left / float64(n)
		}
	}
	return out
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
