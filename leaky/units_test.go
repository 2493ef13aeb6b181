package leaky

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// costStep is one action of a unit step test: advance the clock, then take with cost (expecting
// wait, or retry when nothing may be reserved) or reconcile an earlier take (by its index).
type costStep struct {
	advance   time.Duration
	cost      int64
	ahead     time.Duration
	wait      time.Duration
	retry     bool
	reconcile int   // > 0: reconcile take number reconcile−1 with actual instead of taking
	actual    int64 // the true cost of a reconcile
	pause     time.Duration
}

func runCostSteps(t *testing.T, s CostSchedule, c *clock, r Rate, u Units, steps []costStep) {
	t.Helper()
	ctx := context.Background()
	var charges []Charge
	for i, st := range steps {
		c.Advance(st.advance)
		switch {
		case st.pause > 0:
			if err := s.Pause(ctx, "q", st.pause); err != nil {
				t.Fatalf("step %d: Pause: %v", i, err)
			}
		case st.reconcile > 0:
			if err := s.Reconcile(ctx, "q", charges[st.reconcile-1], st.actual); err != nil {
				t.Fatalf("step %d: Reconcile: %v", i, err)
			}
		default:
			slot, ch, err := s.TakeCost(ctx, "q", r, Ask{Units: u, Cost: st.cost, Ahead: st.ahead})
			if err != nil {
				t.Fatalf("step %d: TakeCost: %v", i, err)
			}
			if slot.Wait != st.wait || slot.retry != st.retry {
				t.Fatalf("step %d (%+v): wait %v retry %v, want %v %v", i, st, slot.Wait, slot.retry, st.wait, st.retry)
			}
			charges = append(charges, ch)
		}
	}
}

// TestCostSteps: a slot satisfies both schedules, both advance from it, and reconciliation
// charges and refunds (clamped) on the unit schedule.
func TestCostSteps(t *testing.T) {
	fast := Rate{Interval: 10 * ms}       // 100 requests/s
	u := Units{N: 1000, Per: time.Second} // 1 unit/ms
	for _, tc := range []struct {
		name  string
		u     Units
		r     Rate
		steps []costStep
	}{
		{"units bind", u, fast, []costStep{
			{cost: 100},                                 // goes now; units until +100ms
			{cost: 50, wait: 100 * ms},                  // waits for the units
			{cost: 1, wait: 150 * ms},                   // after 100+50 units
			{advance: 150 * ms, cost: 1, wait: 10 * ms}, // units free at 151ms, the request slot at 160ms
		}},
		{"requests bind", u, Rate{Interval: 100 * ms}, []costStep{
			{cost: 10},
			{cost: 10, wait: 100 * ms}, // the request slot, not the units (10ms)
			// both schedules advanced from 100ms: the units until 110ms, requests 200ms
			{cost: 10, wait: 200 * ms},
		}},
		{"rational interval rounds each take up", Units{N: 90000, Per: time.Minute}, fast, []costStep{
			{cost: 3},                // 3 × 666.67µs = 2000µs
			{cost: 1, wait: 10 * ms}, // request slot
			{advance: 10 * ms, cost: 2, wait: 10 * ms}, // the second take's units: ⌈666.67⌉ = 667µs, inside 10ms
		}},
		{"burst", Units{N: 1000, Per: time.Second, Burst: 200}, fast, []costStep{
			{cost: 150},
			{cost: 150, wait: 10 * ms}, // the request rate; units within the burst
			{cost: 150, wait: 100 * ms},
		}},
		{"refund of the latest job is exact", u, fast, []costStep{
			{cost: 500},
			{reconcile: 1, actual: 100},
			{cost: 1, wait: 100 * ms},
		}},
		{"charge", u, fast, []costStep{
			{cost: 100},
			{reconcile: 1, actual: 300},
			{cost: 1, wait: 300 * ms},
		}},
		{"refund behind a later reservation is clamped", u, fast, []costStep{
			{cost: 500},                 // 0..500ms
			{cost: 100, wait: 500 * ms}, // slot 500ms, units until 600ms
			{reconcile: 1, actual: 100}, // exactly: 100+... the second slot stays at 500: TAT 600
			{cost: 1, wait: 600 * ms},
		}},
		{"refund after idleness does not reach back", u, fast, []costStep{
			{cost: 500},                    // units until 500ms
			{advance: 800 * ms, cost: 100}, // idle: slot now (800ms), TAT 900ms
			{reconcile: 1, actual: 1},      // 499ms refunded, but the TAT's term runs from 800ms
			{cost: 1, wait: 100 * ms},
		}},
		{"ahead reserves nothing beyond it", u, fast, []costStep{
			{cost: 500},
			{cost: 100, ahead: 100 * ms, wait: 400 * ms, retry: true},
			{reconcile: 1, actual: 50}, // the refund reaches the waiting job
			{cost: 100, ahead: 100 * ms, wait: 50 * ms},
		}},
		{"pause holds the units", u, fast, []costStep{
			{pause: 300 * ms},
			{cost: 10, wait: 300 * ms},
			{cost: 10, wait: 310 * ms},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forEach(t, func(t *testing.T, s Schedule, c *clock) {
				runCostSteps(t, s.(CostSchedule), c, tc.r, tc.u, tc.steps)
			})
		})
	}
}

func TestCostInvalid(t *testing.T) {
	forEach(t, func(t *testing.T, s Schedule, c *clock) {
		cs := s.(CostSchedule)
		for _, a := range []Ask{
			{Units: Units{}, Cost: 1},
			{Units: Units{N: 10, Per: time.Second}, Cost: 0},
			{Units: Units{N: 10, Per: time.Second, Burst: -1}, Cost: 1},
			{Units: Units{N: 1, Per: time.Hour}, Cost: 1 << 40}, // 2^40 hours
		} {
			if _, _, err := cs.TakeCost(context.Background(), "q", perSecond10, a); !errors.Is(err, ErrInvalidRate) {
				t.Errorf("TakeCost(%+v): %v, want ErrInvalidRate", a, err)
			}
		}
	})
}

// TestCostWindowProperty drives random jobs (random arrivals, estimates, true costs; refunds
// and charges reconciled after a random number of later takes, sometimes never) through both
// schedules on a fake clock, each delivered at its slot, and checks against an exact sliding
// window of true units: in every window of Per, the units of every job but the window's last
// stay below N + Burst (so the window holds at most N + Burst plus one job's cost), and the
// request rate holds. Charges are reconciled before the next take, as the guarantee assumes
// (a late charge is not known to the schedule yet).
func TestCostWindowProperty(t *testing.T) {
	for _, u := range []Units{
		{N: 20000, Per: 10 * time.Second},
		{N: 90000, Per: time.Minute, Burst: 3000},
		{N: 7, Per: 100 * ms}, // 14285.7µs per unit
	} {
		t.Run(u.String(), func(t *testing.T) {
			forEach(t, func(t *testing.T, s Schedule, c *clock) {
				costWindowProperty(t, s.(CostSchedule), c, u)
			})
		})
	}
}

type delivered struct {
	at     int64 // µs, the slot
	actual int64
}

func costWindowProperty(t *testing.T, s CostSchedule, c *clock, u Units) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(uint64(u.N), 7))
	r := Rate{Interval: u.Per / time.Duration(4*u.N)} // the units bind
	maxCost := max(u.N/10, 1)
	type pending struct {
		ch     Charge
		actual int64
		after  int // reconcile after this many more takes (-1: never)
	}
	var (
		jobs  []delivered
		owed  []pending
		ahead = []time.Duration{0, 0, 5 * ms}
	)
	for i := range 400 {
		// Reconcile what is due first.
		for k := 0; k < len(owed); k++ {
			if owed[k].after == 0 {
				if err := s.Reconcile(ctx, "q", owed[k].ch, owed[k].actual); err != nil {
					t.Fatal(err)
				}
				owed = append(owed[:k], owed[k+1:]...)
				k--
			} else if owed[k].after > 0 {
				owed[k].after--
			}
		}
		if rng.IntN(4) == 0 {
			c.Advance(time.Duration(rng.Int64N(int64(u.Per) / 4)))
		}
		est := 1 + rng.Int64N(maxCost)
		a := Ask{Units: u, Cost: est, Ahead: ahead[i%len(ahead)]}
		var slot Slot
		var ch Charge
		for {
			var err error
			if slot, ch, err = s.TakeCost(ctx, "q", r, a); err != nil {
				t.Fatal(err)
			}
			if !slot.retry {
				break
			}
			c.Advance(slot.Wait)
		}
		c.Advance(slot.Wait) // delivered at its slot
		actual := est
		after := rng.IntN(4) - 1
		switch rng.IntN(3) {
		case 0:
			actual = rng.Int64N(est + 1) // a refund, now or later, or never (the estimate stands)
		case 1:
			actual = est + rng.Int64N(maxCost) // a charge, before the next take
			after = 0
		}
		if after < 0 {
			actual = est
		} else {
			owed = append(owed, pending{ch, actual, after})
		}
		jobs = append(jobs, delivered{at: c.Now().UnixMicro(), actual: actual})
	}
	per := u.Per.Microseconds()
	for k := range jobs {
		var sum int64
		requests := 0
		for m := k - 1; m >= 0 && jobs[k].at-jobs[m].at < per; m-- {
			sum += jobs[m].actual
			requests++
		}
		if sum >= u.N+u.Burst {
			t.Fatalf("job %d: %d units in the window of %v before it, want < N+Burst = %d", k, sum, u.Per, u.N+u.Burst)
		}
		if k > 0 && jobs[k].at-jobs[k-1].at < r.Interval.Microseconds() {
			t.Fatalf("job %d: %dµs after the previous one, under the request interval %v", k, jobs[k].at-jobs[k-1].at, r.Interval)
		}
	}
	// Not vacuous: the budget was used — some window holds at least 80% of N.
	best := int64(0)
	for k := range jobs {
		var sum int64
		for m := k; m >= 0 && jobs[k].at-jobs[m].at < per; m-- {
			sum += jobs[m].actual
		}
		best = max(best, sum)
	}
	if best < u.N*8/10 {
		t.Fatalf("the fullest window held %d units, want the budget (%d) mostly used", best, u.N)
	}
}

// TestRefundClampProperty: after any history of takes and refunds, the unit schedule is never
// more permissive than one that charged the true costs at the takes: the TAT is at least the
// exact max-plus recurrence of the true costs over the slots actually reserved.
func TestRefundClampProperty(t *testing.T) {
	u := Units{N: 1000, Per: time.Second}
	r := Rate{Interval: time.Millisecond}
	forEach(t, func(t *testing.T, s Schedule, c *clock) {
		cs := s.(CostSchedule)
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(3, 4))
		type job struct {
			ch             Charge
			slot, est, act int64
		}
		var jobs []job
		var refunded []int
		for i := range 300 {
			if rng.IntN(3) == 0 {
				c.Advance(time.Duration(rng.Int64N(400)) * ms)
			}
			est := 1 + rng.Int64N(200)
			slot, ch, err := cs.TakeCost(ctx, "q", r, Ask{Units: u, Cost: est})
			if err != nil {
				t.Fatal(err)
			}
			jobs = append(jobs, job{ch: ch, slot: slot.sched, est: est, act: est})
			// Refund a random earlier job, once.
			if j := rng.IntN(len(jobs)); rng.IntN(2) == 0 && !containsInt(refunded, j) {
				refunded = append(refunded, j)
				jobs[j].act = 1 + rng.Int64N(jobs[j].est) // ≥ 1: the TAT stays ahead of now, for unitTAT
				if err := cs.Reconcile(ctx, "q", jobs[j].ch, jobs[j].act); err != nil {
					t.Fatal(err)
				}
			}
			// The exact recurrence of the true costs over the reserved slots (1µs per unit ×
			// 1000: 1ms per unit).
			var exact int64
			for _, j := range jobs {
				exact = max(exact, j.slot) + j.act*1000
			}
			if got := unitTAT(t, cs, c); got < exact {
				t.Fatalf("after take %d: unit TAT %d, below the exact recurrence of true costs %d (more permissive)", i, got, exact)
			}
		}
	})
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// unitTAT returns queue q's unit TAT, µs, by asking with Ahead 1µs: a take that would wait
// reserves nothing and says when the units are (wait + 1µs from now); one that would not is
// a TAT at or before now.
func unitTAT(t *testing.T, s CostSchedule, c *clock) int64 {
	t.Helper()
	slot, _, err := s.TakeCost(context.Background(), "q", Rate{Interval: time.Microsecond},
		Ask{Units: Units{N: 1000, Per: time.Second}, Cost: 1, Ahead: time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	if !slot.retry {
		t.Fatal("probe reserved a slot: the unit TAT is in the past")
	}
	return c.Now().UnixMicro() + slot.Wait.Microseconds() + 1
}

// TestRedisChargeOnce (issue 39): a charge made again — its first call timed out, maybe after
// the server ran it — moves the unit schedule once: charged 100, true cost 300, reconciled
// twice, the next job's units are 300ms away, not 500ms. Another take's charge still counts.
func TestRedisChargeOnce(t *testing.T) {
	forEach(t, func(t *testing.T, s Schedule, c *clock) {
		if _, ok := s.(*Redis); !ok {
			return // in memory a call cannot fail: no charge is made again
		}
		cs := s.(CostSchedule)
		ctx := context.Background()
		u := Units{N: 1000, Per: time.Second}
		_, first, err := cs.TakeCost(ctx, "q", Rate{Interval: time.Microsecond}, Ask{Units: u, Cost: 100})
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := cs.Reconcile(ctx, "q", first, 300); err != nil {
				t.Fatal(err)
			}
		}
		if got, want := unitTAT(t, cs, c)-c.Now().UnixMicro(), int64(300_000); got != want {
			t.Fatalf("unit TAT %dµs from now after the same charge made twice, want %d (made once)", got, want)
		}
	})
}
