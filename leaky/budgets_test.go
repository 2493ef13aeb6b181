package leaky

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestBudgetSteps: a job's slot satisfies every named budget, each budget advances from it by
// its own units, and each is reconciled on its own.
func TestBudgetSteps(t *testing.T) {
	in := Units{N: 1000, Per: time.Second} // 1 unit/ms
	out := Units{N: 100, Per: time.Second} // 1 unit/10ms
	fast := Rate{Interval: ms}
	asks := func(i, o int64) []Ask {
		return []Ask{{Units: in, Cost: i, Budget: "input"}, {Units: out, Cost: o, Budget: "output"}}
	}
	forEach(t, func(t *testing.T, s Schedule, c *clock) {
		bs := s.(BudgetSchedule)
		ctx := context.Background()
		var charges [][]Charge
		take := func(i, o int64, want time.Duration) {
			t.Helper()
			slot, cs, err := bs.TakeCosts(ctx, "q", fast, asks(i, o))
			if err != nil {
				t.Fatal(err)
			}
			if slot.Wait != want || slot.retry || len(cs) != 2 {
				t.Fatalf("take %d,%d: wait %v retry %v charges %d, want %v", i, o, slot.Wait, slot.retry, len(cs), want)
			}
			charges = append(charges, cs)
		}
		take(100, 10, 0)                                                  // input until 100ms, output until 100ms
		take(10, 50, 100*ms)                                              // both at 100ms: input until 110ms, output until 600ms (binds)
		if err := bs.Reconcile(ctx, "q", charges[1][1], 10); err != nil { // output refunded 40 units
			t.Fatal(err)
		}
		take(1000, 1, 200*ms)                                              // output now until 200ms; input until 1200ms
		if err := bs.Reconcile(ctx, "q", charges[0][0], 100); err != nil { // nothing to change
			t.Fatal(err)
		}
		take(1, 1, 1200*ms) // input binds now
		// Ahead: the units come 1.2s on; nothing is reserved, and the wait says when to ask again.
		a := asks(1, 1)
		a[0].Ahead = 100 * ms
		slot, _, err := bs.TakeCosts(ctx, "q", fast, a)
		if err != nil || !slot.retry || slot.Wait != 1110*ms {
			t.Fatalf("take beyond ahead: %+v, %v; want retry after 1.11s (output until 1.21s)", slot, err)
		}
		// The queue's own unit budget (TakeCost) is a schedule apart: its units are free.
		if slot, _, err := bs.TakeCost(ctx, "q", fast, Ask{Units: in, Cost: 5}); err != nil || slot.Wait < 1200*ms || slot.Wait > 1201*ms {
			// The request schedule is shared: its last slot was the fourth take's (Memory's
			// request tolerance is one interval, Redis's burst × interval).
			t.Fatalf("TakeCost beside budgets: %+v, %v; want the request slot at 1.2s", slot, err)
		}
		for _, bad := range [][]Ask{nil, {{Units: in, Cost: 1}}, {{Units: in, Cost: 1, Budget: "x"}, {Units: in, Cost: 1, Budget: "x"}},
			{{Units: in, Cost: 0, Budget: "x"}}} {
			if _, _, err := bs.TakeCosts(ctx, "q", fast, bad); !errors.Is(err, ErrInvalidRate) {
				t.Errorf("TakeCosts(%+v) = %v, want ErrInvalidRate", bad, err)
			}
		}
	})
}

// TestRedisBudgetChargeOnce (issue 39): a budget's charge made again — its first call timed
// out, maybe after the server ran it, and the worker made it again as an owed charge — moves
// that budget's schedule once: output charged 100, true cost 300, reconciled twice, the next
// take's output units are 300ms away, not 500ms. The input budget is untouched.
func TestRedisBudgetChargeOnce(t *testing.T) {
	u := Units{N: 1000, Per: time.Second} // 1 unit/ms
	forEach(t, func(t *testing.T, s Schedule, c *clock) {
		if _, ok := s.(*Redis); !ok {
			return // in memory a call cannot fail: no charge is made again
		}
		bs := s.(BudgetSchedule)
		ctx := context.Background()
		asks := func(i, o int64) []Ask {
			return []Ask{{Units: u, Cost: i, Budget: "input"}, {Units: u, Cost: o, Budget: "output"}}
		}
		_, cs, err := bs.TakeCosts(ctx, "q", Rate{Interval: time.Microsecond}, asks(1, 100))
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := bs.Reconcile(ctx, "q", cs[1], 300); err != nil {
				t.Fatal(err)
			}
		}
		a := asks(1, 1)
		a[0].Ahead = time.Microsecond
		slot, _, err := bs.TakeCosts(ctx, "q", Rate{Interval: time.Microsecond}, a)
		if err != nil || !slot.retry {
			t.Fatalf("probe: %+v, %v; want nothing reserved", slot, err)
		}
		if got, want := slot.Wait+time.Microsecond, 300*ms; got != want {
			t.Fatalf("output units %v from now after the same charge made twice, want %v (made once)", got, want)
		}
	})
}
