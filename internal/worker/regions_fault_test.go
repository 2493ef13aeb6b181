package worker_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// TestRegionsCoordinatorKilled: the coordinator (a nats-server process) is SIGKILLed while two
// regions drain a global queue of 50/s, and restarted on its store some seconds later. The
// regions keep delivering on their leases, then on their safe shares (25/s each, even), raise
// sluice_region_lease_lost once without a lease for longer than a lease and a renewal, and
// take leases again after the restart. In every 1 s window the upstream sees at most the
// stated bound for a lost coordinator, B + (R−1)·σ + R·(1 + b) = 79 (docs/design/regions.md);
// once the restarted coordinator's shares settle, the connected bound, B + R·(1 + b) = 54.
//
// As in partition, the pools run 16 in flight, the rates' lower bounds count the slots a region
// delivered on or gave up for waking too late, and an attempt whose shortfall the process's
// stalls (testenv.Lag) explain is made again, up to 3 times.
func TestRegionsCoordinatorKilled(t *testing.T) {
	for attempt := 1; ; attempt++ {
		var short string
		t.Run(fmt.Sprintf("attempt%d", attempt), func(t *testing.T) { short = coordinatorKilled(t) })
		if t.Failed() || short == "" {
			return
		}
		t.Logf("attempt %d: %s", attempt, short)
		if attempt == 3 {
			t.Fatalf("in 3 attempts the regions' slots fell short, each time as the machine stalled them")
		}
	}
}

// coordinatorKilled is one attempt of TestRegionsCoordinatorKilled; it returns a shortfall the
// process's stalls explain, or "".
func coordinatorKilled(t *testing.T) string {
	h := newHarness(t)
	coord := testenv.NATSProc(t)
	a, b := newRegion(t, h.ctx, "a", coord.URL), newRegion(t, h.ctx, "b", coord.URL)
	aIDs := idSet(workertest.Publish(t, a.qs, "llm", 700, false))
	bIDs := idSet(workertest.Publish(t, b.qs, "llm", 500, false))
	spec := h.spec("llm", 50)
	spec.Concurrency = 16
	regs := map[string]*prometheus.Registry{"a": a.runSpec(t, h, spec, -1), "b": b.runSpec(t, h, spec, -1)}
	ups := map[string]*givenUp{"a": sampleGivenUp(t, regs["a"]), "b": sampleGivenUp(t, regs["b"])}
	lag := testenv.NewLag(t)
	gauge := func(name string) (a, b float64) {
		return metric(t, regs["a"], name, "queue", "llm"), metric(t, regs["b"], name, "queue", "llm")
	}
	both := func(name string, want func(float64) bool) func() bool {
		return func() bool { va, vb := gauge(name); return want(va) && want(vb) }
	}
	onLease := func(v float64) bool { return v > float64(time.Now().UnixMilli())/1000 }
	is := func(want float64) func(float64) bool { return func(v float64) bool { return v == want } }

	// Past the fresh coordinator's hold: both regions on leases.
	testenv.WaitFor(t, 10*time.Second, "both regions on leases", both("sluice_region_lease_expiry_timestamp_seconds", onLease))
	killed := time.Now()
	coord.Kill()
	testenv.WaitFor(t, 5*time.Second, "both regions on their safe shares", both("sluice_region_on_safe_share", is(1)))
	safeFrom := time.Now()
	testenv.WaitFor(t, 5*time.Second, "sluice_region_lease_lost on both", both("sluice_region_lease_lost", is(1)))
	lostAt := time.Now()
	coord.Start()
	restarted := time.Now()
	testenv.WaitFor(t, 5*time.Second, "both regions on leases again", both("sluice_region_on_safe_share", is(0)))
	resumed := time.Now()
	// The first region to renew takes what the other does not hold; the other's renewal gets
	// the rest, then its even part once the first's lowered share stopped lingering.
	testenv.WaitFor(t, 5*time.Second, "both regions at 25/s", both("sluice_region_share", is(25)))
	settled := time.Now()
	testenv.WaitFor(t, 10*time.Second, "2 s of settled shares", func() bool { return time.Now().After(settled.Add(2 * time.Second)) })
	end := time.Now()
	if la, lb := gauge("sluice_region_lease_lost"); la != 0 || lb != 0 {
		t.Errorf("sluice_region_lease_lost after the restart: a %v, b %v; want 0", la, lb)
	}

	all, sets := arrivalSets(h.up, aIDs, bIDs)
	aAts, bAts := sets[0], sets[1]
	most := maxWindow(all, all[0], end)
	after := maxWindow(all, settled, end)
	aSafe, bSafe := rateIn(aAts, safeFrom.Add(500*time.Millisecond), lostAt), rateIn(bAts, safeFrom.Add(500*time.Millisecond), lostAt)
	total := rateIn(all, settled, end)
	t.Logf("budget 50/s, coordinator killed at +%.1fs: both on safe shares %.1fs later (a %.1f/s, b %.1f/s), "+
		"lease lost %.1fs after the kill; restarted, on leases %.1fs after, at 25/s each %.1fs after; most in any 1 s window %d (bound 79), "+
		"%d once settled (bound 54), %.1f/s settled",
		killed.Sub(all[0]).Seconds(), safeFrom.Sub(killed).Seconds(), aSafe, bSafe, lostAt.Sub(killed).Seconds(),
		resumed.Sub(restarted).Seconds(), settled.Sub(restarted).Seconds(), most, after, total)
	t.Logf("per second a/b: %s", timeline(aAts, bAts, all[0], end))
	if most > 50+25+connectedBound {
		t.Errorf("the upstream saw %d in a 1 s window; the lost coordinator's bound is 79", most)
	}
	if after > 50+connectedBound {
		t.Errorf("the upstream saw %d in a 1 s window once the restarted coordinator's shares settled; bound 54", after)
	}
	var short []string
	// low checks slots per second handed out over [from, to) against want; a shortfall the
	// process's stalls explain (a stall of d costs at most d × rate) is returned, any other fails.
	low := func(what string, slots, want, rate float64, from, to time.Time) {
		if slots >= want {
			return
		}
		msg := fmt.Sprintf("%s: %.1f slots/s delivered on or given up; want ≥ %.0f", what, slots, want)
		lost, _ := lag.Lost(from, to)
		if missed := (want - slots) * to.Sub(from).Seconds(); lost.Seconds()*rate < missed {
			t.Errorf("%s; the process lost only %v, %.1f of the %.1f slots missing", msg, lost, lost.Seconds()*rate, missed)
		} else {
			short = append(short, fmt.Sprintf("%s; the process lost %v meanwhile", msg, lost))
		}
	}
	safeAt := safeFrom.Add(500 * time.Millisecond)
	for name, r := range map[string]float64{"a": aSafe, "b": bSafe} {
		if r > 26 {
			t.Errorf("%s delivered %.1f/s on its safe share; want 25/s", name, r)
		}
		low(name+" on its safe share (25/s)", r+ups[name].in(safeAt, lostAt)/lostAt.Sub(safeAt).Seconds(), 20, 25, safeAt, lostAt)
	}
	if settled.Sub(restarted) > 3*time.Second {
		t.Errorf("the shares settled %v after the restart; want within 2·renew + 0.5 s of the first renewals (3 s)", settled.Sub(restarted))
	}
	// The shares (25/s each) are checked above; this, that they are used.
	low("the regions together once settled (50/s)", total+(ups["a"].in(settled, end)+ups["b"].in(settled, end))/end.Sub(settled).Seconds(),
		40, 50, settled, end)
	return strings.Join(short, "; ")
}
