package fair

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/queue"
)

// One tenant's levels within its share, one row per rule: a row starts from the tenant's
// depths per level (high, normal, low), then takes its steps in order, each an optional new
// reading or a level found empty, and a take of n jobs: want is the counts per level, or, for
// a step with one, the levels of the n jobs taken one at a time, a letter each (h, n, l).
func TestLevels(t *testing.T) {
	type step struct {
		set   *queue.Levels // non-nil: a new reading first
		empty int           // > 0: level empty-1 turned out empty first
		n     int
		want  string // counts per level, "h3 n1 l0", or with one:true the letters in order
		one   bool   // take the n jobs one at a time and want their letters in order
	}
	lv := func(h, n, l uint64) *queue.Levels { return &queue.Levels{h, n, l} }
	for _, c := range []struct {
		name  string
		start queue.Levels
		steps []step
	}{
		{name: "normal only takes normal", start: queue.Levels{0, 10, 0}, steps: []step{
			{n: 4, want: "h0 n4 l0"}, {n: 10, want: "h0 n6 l0"}, {n: 1, want: "h0 n0 l0"},
		}},
		{name: "high before normal before low while the guard allows", start: queue.Levels{3, 3, 0}, steps: []step{
			{n: 6, one: true, want: "hhhnnn"},
		}},
		{name: "a waiting low level gets 1 of every 8", start: queue.Levels{20, 0, 300}, steps: []step{
			{n: 24, one: true, want: "hhhhhhhl" + "hhhhhhhl" + "hhhhhhll"},
		}},
		{name: "the guard counts across takes", start: queue.Levels{20, 0, 300}, steps: []step{
			{n: 5, want: "h5 n0 l0"}, {n: 5, want: "h4 n0 l1"}, {n: 3, want: "h3 n0 l0"},
		}},
		{name: "low and normal both waiting behind high", start: queue.Levels{30, 30, 30}, steps: []step{
			// Normal's and low's counts reach 7 together; low, the lowest due, goes first
			// (as the workers' guard on plain queues), and normal then at once.
			{n: 18, one: true, want: "hhhhhhhlnhhhhhhlhn"},
		}},
		{name: "normal guarded against high, low waits for both", start: queue.Levels{10, 10, 0}, steps: []step{
			{n: 16, one: true, want: "hhhhhhhnhhhnnnnn"},
		}},
		{name: "an empty lower level does not save turns", start: queue.Levels{20, 0, 0}, steps: []step{
			{n: 10, want: "h10 n0 l0"},
			{set: lv(10, 0, 5), n: 8, one: true, want: "hhhhhhhl"},
		}},
		{name: "a level found empty gives nothing until reread", start: queue.Levels{5, 5, 0}, steps: []step{
			{empty: 1, n: 4, want: "h0 n4 l0"},
			{set: lv(5, 5, 0), n: 2, want: "h2 n0 l0"},
		}},
		{name: "fewer than asked when fewer wait", start: queue.Levels{1, 1, 1}, steps: []step{
			{n: 5, one: true, want: "hnl"},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var l levels
			l.set(c.start)
			for i, s := range c.steps {
				if s.set != nil {
					l.set(*s.set)
				}
				if s.empty > 0 {
					l.empty(s.empty - 1)
				}
				var got string
				if s.one {
					var b strings.Builder
					for range s.n {
						k := l.take(1)
						for j, ch := range "hnl" {
							if k[j] == 1 {
								b.WriteRune(ch)
							}
						}
					}
					got = b.String()
				} else {
					k := l.take(s.n)
					got = fmt.Sprintf("h%d n%d l%d", k[0], k[1], k[2])
				}
				if got != s.want {
					t.Errorf("step %d: took %q, want %q", i, got, s.want)
				}
			}
		})
	}
}

// TestLevelsGuardBound: from several mixes of depths, taken one job at a time to the end, no
// level that waits sees more than starveAfter-1 jobs of higher levels in a row, and every job
// is taken.
func TestLevelsGuardBound(t *testing.T) {
	for _, start := range []queue.Levels{{100, 1, 100}, {100, 100, 1}, {50, 50, 50}, {8, 0, 8}} {
		var l levels
		l.set(start)
		run := [3]int{} // per level, jobs of higher levels taken in a row while it waited
		for {
			waiting := l.depth
			k := l.take(1)
			i := -1
			for j := range k {
				if k[j] == 1 {
					i = j
				}
			}
			if i < 0 {
				break
			}
			for lower := i + 1; lower < 3; lower++ {
				if waiting[lower] > 0 {
					if run[lower]++; run[lower] > starveAfter-1 {
						t.Fatalf("from %v: %d jobs above level %d in a row while it waited", start, run[lower], lower)
					}
				}
			}
			run[i] = 0
		}
		if l.depth.Sum() != 0 {
			t.Errorf("from %v: %v left", start, l.depth)
		}
	}
}
