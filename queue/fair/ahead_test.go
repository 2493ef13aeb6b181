package fair

import (
	"testing"
	"time"
)

// A moved job counts as waiting until the consumer delivers it, or for unseenFor at most
// beyond the consumer's pending count; the units waiting are the newest waiting moves' costs,
// and an unknown cost for each job the consumer counts beyond those the leader knows of.
func TestAhead(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	check := func(step string, a *ahead, delivered, pending uint64, at time.Duration, jobs int, units float64) {
		t.Helper()
		j, u := a.waiting(delivered, pending, t0.Add(at), 50)
		if j != jobs || u != units {
			t.Errorf("%s: %d jobs and %v units waiting, want %d and %v", step, j, u, jobs, units)
		}
	}
	var a ahead
	a.add([]uint64{12, 10, 11}, []int64{3, 1, 2}, t0) // tenants move in parallel: any order
	check("none delivered, none counted", &a, 9, 0, 0, 3, 6)
	check("delivered up to 11", &a, 11, 0, time.Millisecond, 1, 3)
	a.add([]uint64{13}, []int64{7}, t0.Add(50*time.Millisecond))
	// A consumer made anew counts from 0; past unseenFor 12 is presumed deleted.
	check("after unseenFor", &a, 0, 0, unseenFor, 1, 7)
	check("all past unseenFor", &a, 0, 0, 50*time.Millisecond+unseenFor, 0, 0)
	if len(a.moves) != 0 {
		t.Fatalf("%d moves kept, want 0", len(a.moves))
	}

	var b ahead
	b.add([]uint64{20, 21}, []int64{100, 10}, t0)
	check("counted by the consumer, and 2 more an earlier leader moved", &b, 19, 4, time.Second, 4, 210)
	check("the consumer counts one of two: the newest is kept", &b, 19, 1, 2*time.Second, 1, 10)
	check("a job missing its cost costs 1", func() *ahead { var c ahead; c.add([]uint64{5}, nil, t0); return &c }(), 0, 0, 0, 1, 1)
}
