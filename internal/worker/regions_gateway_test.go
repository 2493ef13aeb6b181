package worker_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/queue"
)

// The tests in this file run the regions as they run across data centres: each region its own
// NATS cluster, the clusters joined by gateways into a supercluster (testenv.NewSupercluster),
// every gateway link through Toxiproxy adding gatewayLatency each way, the coordinator's
// bucket placed in the home region a's cluster (regions.home), and each region's worker
// reaching it through its own region's server. Region b's renewals thus cross the gateway: a
// read and a compare-and-set write, each a 100 ms round trip. SLUICE_REGIONS_SOAK=1 (make
// soak) runs the full counts and a 30 s cut; make test runs them scaled down.

// gatewayLatency is what the link between two regions adds in each direction.
const gatewayLatency = 50 * time.Millisecond

// regionsSoak reports whether the soak variants run (make soak).
func regionsSoak() bool { return os.Getenv("SLUICE_REGIONS_SOAK") == "1" }

// gatewayParallel runs a gateway test beside the others in make test (t.Parallel): each has a
// supercluster, harness and upstream of its own and mostly waits (leases, renewals over 100 ms
// round trips, cuts and kills of seconds), so together they take about as long as the longest
// (quiet machine: 80 s one at a time, 31 s together). make soak, where the delivered rates are
// held to their figures, runs each alone as before.
func gatewayParallel(t *testing.T) {
	if !regionsSoak() {
		t.Parallel()
	}
}

// newGatewayRegion is region name of sc: its queues on its own server, and its connection to
// the coordinator to that same server, the bucket in sc's home region (its first).
func newGatewayRegion(t *testing.T, ctx context.Context, name string, sc *testenv.Supercluster) *region {
	t.Helper()
	js, err := jetstream.New(testenv.Connect(t, sc.URL(name)))
	if err != nil {
		t.Fatal(err)
	}
	// Stream names are one namespace across a supercluster (per account): each region's
	// queues carry their own prefix, as each region's deployment has its own account in
	// production (docs/regions.md).
	qs, err := queue.New(ctx, js, queue.Options{Prefix: testenv.Name(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := qs.Provision(ctx, []queue.Spec{{Name: "llm"}}); err != nil {
		t.Fatal(err)
	}
	nc := testenv.Connect(t, sc.URL(name))
	cjs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &region{name: name, home: sc.Names[0], qs: qs, coord: cjs, close: nc.Close}
}

// runFast starts r's two worker pools (two holders of the region's lease, sharing its leak
// schedule and queue, as two worker processes do) on the global queue llm at 100/s with 8
// deliveries in flight each: at the default 4, a job's turn (slot, request, ack) on a loaded
// 2-core machine caps a region below 50/s, and the figures would measure that, not the
// leases. It returns the pools' metrics.
func (r *region) runFast(t *testing.T, h *harness) []*prometheus.Registry {
	t.Helper()
	spec := h.spec("llm", 100)
	spec.Concurrency = 8
	return []*prometheus.Registry{r.runSpec(t, h, spec, -1), r.runSpec(t, h, spec, -1)}
}

// regionGauge is a region's gauge name of the queue llm over its pools: for
// sluice_region_on_safe_share the most (any pool on it), else the least (a share: the region
// delivers at least its pools' least share, whose leak slots take from one schedule).
func regionGauge(t *testing.T, pools []*prometheus.Registry, name string) float64 {
	t.Helper()
	v := metric(t, pools[0], name, "queue", "llm")
	for _, p := range pools[1:] {
		if name == "sluice_region_on_safe_share" {
			v = max(v, metric(t, p, name, "queue", "llm"))
		} else {
			v = min(v, metric(t, p, name, "queue", "llm"))
		}
	}
	return v
}

// logWrites logs the regions' renewal writes and compare-and-set conflicts over d: the cost of
// renewing on change, beside the periodic renewals' (a write per pool and renew period).
func logWrites(t *testing.T, d time.Duration, rs ...*region) {
	t.Helper()
	for _, r := range rs {
		w, c := r.writes()
		renew := 500 * time.Millisecond
		if r.renew > 0 {
			renew = r.renew
		}
		t.Logf("region %s: %d renewal writes in %.1fs (%.1f/s; periodic alone %.1f/s), %d compare-and-set conflicts (%.1f%%)",
			r.name, w, d.Seconds(), float64(w)/d.Seconds(), float64(len(r.coords))/renew.Seconds(), c, 100*float64(c)/float64(max(w, 1)))
	}
}

// shareSample is both regions' sluice_region_share (the least of its pools') at one instant.
type shareSample struct {
	at   time.Time
	a, b float64
	bExp float64 // b's lease expiry (sluice_region_lease_expiry_timestamp_seconds): moves at each renewal with a share
	bErr float64 // b's failed renewals (sluice_region_renewal_failures_total)
}

// sampleShares reads a's and b's sluice_region_share every 20 ms until the returned function is
// called, which returns the samples: what the regions were handed out, apart from what a
// loaded machine lets them deliver.
func sampleShares(t *testing.T, a, b []*prometheus.Registry) func() []shareSample {
	var out []shareSample
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			out = append(out, shareSample{time.Now(), regionGauge(t, a, "sluice_region_share"),
				regionGauge(t, b, "sluice_region_share"),
				testenv.Metric(t, b[0], "sluice_region_lease_expiry_timestamp_seconds", "queue", "llm"),
				testenv.Metric(t, b[0], "sluice_region_renewal_failures_total", "queue", "llm")})
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	var once sync.Once
	stop := func() { once.Do(func() { close(done); <-exited }) }
	t.Cleanup(stop)
	return func() []shareSample { stop(); return out }
}

// handedOut is the mean of a + b over the samples in [from, to).
func handedOut(ss []shareSample, from, to time.Time) float64 {
	sum, n := 0.0, 0
	for _, s := range ss {
		if !s.at.Before(from) && s.at.Before(to) {
			sum, n = sum+s.a+s.b, n+1
		}
	}
	return sum / float64(max(n, 1))
}

// handedFrom is the first sample at or after from from which a + b stays at least n.
func handedFrom(ss []shareSample, n float64, from time.Time) (time.Time, bool) {
	at, ok := time.Time{}, false
	for _, s := range ss {
		switch {
		case s.at.Before(from):
		case s.a+s.b < n:
			ok = false
		case !ok:
			at, ok = s.at, true
		}
	}
	return at, ok
}

// shareLine is the samples' a/b shares every step from from to to, as "a/b a/b ...".
func shareLine(ss []shareSample, from, to time.Time, step time.Duration) string {
	var out []byte
	next := from
	for _, s := range ss {
		if s.at.Before(next) || s.at.After(to) {
			continue
		}
		out = fmt.Appendf(out, "%.0f/%.0f ", s.a, s.b)
		next = next.Add(step)
	}
	return string(out)
}

// renewals is when b's renewals that returned a lease were first seen, from from on, in seconds
// after from (each moves b's lease expiry).
func renewals(ss []shareSample, from, to time.Time) string {
	var out []byte
	last, lastErr := 0.0, 0.0
	for _, s := range ss {
		if !s.at.Before(from) && !s.at.After(to) && s.bExp != last {
			out = fmt.Appendf(out, "%.2f(%.0f) ", s.at.Sub(from).Seconds(), s.b)
		}
		if !s.at.Before(from) && !s.at.After(to) && s.bErr != lastErr {
			out = fmt.Appendf(out, "%.2f(failed) ", s.at.Sub(from).Seconds())
		}
		last, lastErr = s.bExp, s.bErr
	}
	return string(out)
}

// bothRenewed is when both regions' shares were first read above 0: each worker's gauge is
// set by its first renewal, whatever it then runs on.
func bothRenewed(ss []shareSample) time.Time {
	for _, s := range ss {
		if s.a > 0 && s.b > 0 {
			return s.at
		}
	}
	return time.Time{}
}

// spread is the bound's B·δ term (docs/design/regions.md) for a budget of b per second: δ, the
// spread between a delivery's slot and its arrival at the upstream, is taken as 20 ms on the
// loaded 2-core machine (a stalled process sends the slots of a stall together).
func spread(b float64) int { return int(math.Ceil(b * 0.020)) }

// firstWindowAtLeast returns the end of the first 1 s window starting at or after from (in
// steps of 100 ms, ending by to) with at least n of ats, and false when none has.
func firstWindowAtLeast(ats []time.Time, n int, from, to time.Time) (time.Time, bool) {
	for w := from; !w.Add(time.Second).After(to); w = w.Add(100 * time.Millisecond) {
		if rateIn(ats, w, w.Add(time.Second)) >= float64(n) {
			return w.Add(time.Second), true
		}
	}
	return time.Time{}, false
}

// sustainedFrom returns the first instant from which every 1 s window (in steps of 100 ms, the
// last ending by to) has at least n of ats, and false when the last window has fewer.
func sustainedFrom(ats []time.Time, n int, from, to time.Time) (time.Time, bool) {
	at, ok := time.Time{}, false
	for w := from; !w.Add(time.Second).After(to); w = w.Add(100 * time.Millisecond) {
		switch full := rateIn(ats, w, w.Add(time.Second)) >= float64(n); {
		case !full:
			ok = false
		case !ok:
			at, ok = w, true
		}
	}
	return at, ok
}

// TestRegionsGatewayShare: a global rate of 100/s, backlogs of 9 000 jobs in region a and
// 1 000 in b (1 800 and 200 in make test), the regions 50 ms apart each way. The upstream sees
// at most 100 + the connected bound (104; aim 102) in any 1 s window, ≥ 97/s while both have
// backlog, and a alone reaches ≥ 95/s within 5 s of b's backlog running out.
func TestRegionsGatewayShare(t *testing.T) {
	gatewayParallel(t)
	nA, nB := 1800, 200
	if regionsSoak() {
		nA, nB = 9000, 1000
	}
	h := newHarness(t)
	sc := testenv.NewSupercluster(t, gatewayLatency, "a", "b")
	a, b := newGatewayRegion(t, h.ctx, "a", sc), newGatewayRegion(t, h.ctx, "b", sc)
	aIDs := idSet(workertest.Publish(t, a.qs, "llm", nA, false))
	bIDs := idSet(workertest.Publish(t, b.qs, "llm", nB, false))
	began := time.Now()
	aRegs := a.runFast(t, h)
	shares := sampleShares(t, aRegs, b.runFast(t, h))
	h.up.WaitCount(t, time.Duration(nB/25+15)*time.Second, "region b's backlog delivered", func(int) bool {
		return len(arrivalTimes(h.up, bIDs)) >= len(bIDs)
	})
	bDone := arrivalTimes(h.up, bIDs)[len(bIDs)-1]
	// Wait up to 10 s for a alone near the budget, delivered and handed out (both its pools'
	// shares); the figures are logged either way.
	var aAt time.Time
	for aOK := false; !aOK && time.Since(bDone) < 10*time.Second; time.Sleep(50 * time.Millisecond) {
		aAt, aOK = firstWindowAtLeast(arrivalTimes(h.up, aIDs), int(delivered(95)), bDone, time.Now())
		aOK = aOK && regionGauge(t, aRegs, "sluice_region_share") >= 95
	}
	ss := shares()
	if aAt.IsZero() {
		aAt = time.Now() // not reached: the window ends now, and the check below fails
	}
	all := arrivalTimes(h.up, nil)
	first := all[0]
	most := maxWindow(all, first, aAt)
	from := first.Add(time.Second) // past the start, and both regions' first renewals
	if r := bothRenewed(ss); r.After(from) {
		from = r
	}
	both := rateIn(all, from, bDone.Add(-500*time.Millisecond))
	handed := handedOut(ss, from, bDone.Add(-500*time.Millisecond))
	aShare, aShareOK := handedFrom(aOnly(ss), 95, bDone)
	t.Logf("budget 100/s over gateways (50 ms each way), backlogs %d/%d: most in any 1 s window %d (bound %d, aim 102); "+
		"both backlogged %.1f/s delivered, %.1f/s handed out, over %.1fs; b empty at +%.1fs, a's share ≥ 95/s %.1fs later, "+
		"a delivering ≥ %.0f/s %.1fs later; %d delivered",
		nA, nB, most, 100+connectedBound, both, handed, bDone.Sub(from).Seconds()-0.5, bDone.Sub(first).Seconds(),
		aShare.Sub(bDone).Seconds(), delivered(95), aAt.Sub(bDone).Seconds(), len(all))
	t.Logf("per second a/b: %s", timeline(arrivalTimes(h.up, aIDs), arrivalTimes(h.up, bIDs), first, aAt))
	logWrites(t, time.Since(began), a, b)
	t.Logf("shares every 0.5 s a/b: %s", shareLine(ss, first, aAt, 500*time.Millisecond))
	if most > 100+connectedBound+spread(100) {
		t.Errorf("the upstream saw %d in a 1 s window; budget 100 + bound %d + spread %d", most, connectedBound, spread(100))
	}
	if handed < 97 {
		t.Errorf("both regions backlogged were handed %.1f/s together; want ≥ 97", handed)
	}
	if !aShareOK || aShare.Sub(bDone) > 5*time.Second {
		t.Errorf("region a alone was handed 95/s %v after b's backlog ran out (%v); want within 5 s", aShare.Sub(bDone), aShareOK)
	}
	if regionsSoak() && both < 97 {
		t.Errorf("both regions backlogged delivered %.1f/s together; want ≥ 97", both)
	}
	if regionsSoak() && aAt.Sub(bDone) > 5*time.Second {
		t.Errorf("region a alone delivered 95/s %v after b's backlog ran out; want within 5 s", aAt.Sub(bDone))
	}
}

// delivered is the delivered rate the figures' waits look for, for a figure of want per second
// at the upstream: want in the soak runs (make soak, a machine of its own), where it is held to
// it; 80% of it in make test, where it is logged only. There other builds and tests share the 2
// cores, a late wake-up loses a slot, and a loaded second delivers half the budget whatever the
// leases say; make test holds what the regions are handed (their shares) to the figures, and
// the upstream to the bounds, which load cannot break.
func delivered(want float64) float64 {
	if regionsSoak() {
		return want
	}
	return 0.8 * want
}

// sharesIn reports whether every sample in [from, to) has a's share wantA and b's wantB (< 0:
// either), and the first sample that does not.
func sharesIn(ss []shareSample, from, to time.Time, wantA, wantB float64) (shareSample, bool) {
	for _, s := range ss {
		if s.at.Before(from) || !s.at.Before(to) {
			continue
		}
		if (wantA >= 0 && s.a != wantA) || (wantB >= 0 && s.b != wantB) {
			return s, false
		}
	}
	return shareSample{}, true
}

// aOnly is the samples with b's share left out: a's share alone.
func aOnly(ss []shareSample) []shareSample {
	out := make([]shareSample, len(ss))
	for i, s := range ss {
		out[i] = shareSample{at: s.at, a: s.a}
	}
	return out
}

// TestRegionsGatewayCut: the gateway link between the regions is cut (the proxies disabled)
// for 30 s (8 s in make test) while both drain a global queue of 100/s, then healed. Region b
// loses the coordinator in a's cluster: it runs on its lease until it expires, then on its
// even safe share (50/s), while a takes the whole budget once b's lease expired. The upstream
// sees at most B·(1 + k/R) + R·(1 + b) = 154 in any 1 s window. After the heal the regions are
// handed ≥ 95% of the budget again, for good, within 2·renew and two renewals' round trips of
// the gateways' return, their shares following demand (50/s each) again.
func TestRegionsGatewayCut(t *testing.T) {
	gatewayParallel(t)
	cutFor, nA, nB := 8*time.Second, 2000, 1000
	if regionsSoak() {
		cutFor, nA, nB = 30*time.Second, 6000, 3000
	}
	// A renew period of 1 s (lease 4 s): the heal's fixed costs (renewals of one or two 100 ms
	// round trips, the 200 ms linger, the pacing) are then small beside it, as they are beside
	// the default 2.5 s, and the heal's bound of two periods is measured, not those costs.
	const lease, renew = 4 * time.Second, time.Second
	h := newHarness(t)
	sc := testenv.NewSupercluster(t, gatewayLatency, "a", "b")
	a, b := newGatewayRegion(t, h.ctx, "a", sc), newGatewayRegion(t, h.ctx, "b", sc)
	a.lease, a.renew, b.lease, b.renew = lease, renew, lease, renew
	aIDs := idSet(workertest.Publish(t, a.qs, "llm", nA, false))
	bIDs := idSet(workertest.Publish(t, b.qs, "llm", nB, false))
	began := time.Now()
	regs := map[string][]*prometheus.Registry{"a": a.runFast(t, h), "b": b.runFast(t, h)}
	shares := sampleShares(t, regs["a"], regs["b"])
	gauge := func(name string) (a, b float64) {
		return regionGauge(t, regs["a"], name), regionGauge(t, regs["b"], name)
	}
	onLeases := func() bool {
		shareA, shareB := gauge("sluice_region_share")
		safeA, safeB := gauge("sluice_region_on_safe_share")
		return shareA == 50 && shareB == 50 && safeA == 0 && safeB == 0
	}
	testenv.WaitFor(t, 30*time.Second, "both regions on leases of 50/s", onLeases)
	cut := sc.Cut()
	testenv.WaitFor(t, 2*lease, "b on its safe share", func() bool { _, b := gauge("sluice_region_on_safe_share"); return b == 1 })
	bSafe := time.Now()
	testenv.WaitFor(t, cutFor+10*time.Second, "the cut to last", func() bool { return time.Since(cut) >= cutFor })
	heal := sc.Heal()
	sc.WaitHealed(15 * time.Second)
	linked := time.Now()
	testenv.WaitFor(t, 15*time.Second, "both regions back on leases of 50/s", onLeases)
	settled := time.Now()
	testenv.WaitFor(t, 10*time.Second, "2 s of settled shares", func() bool { return time.Since(settled) >= 2*time.Second })
	end := time.Now()
	ss := shares()

	all, sets := arrivalSets(h.up, aIDs, bIDs)
	aAts, bAts := sets[0], sets[1]
	before, during, after := maxWindow(all, all[0], cut), maxWindow(all, cut, heal), maxWindow(all, heal, end)
	afterSettled := maxWindow(all, settled, end)
	full := bSafe.Add(renew + time.Second) // a's renewal after b's lease expired, and a second
	bRate, aRate := rateIn(bAts, bSafe.Add(200*time.Millisecond), heal), rateIn(aAts, full, heal)
	handedAt, handedOK := handedFrom(ss, 95, linked)
	usedAt, usedOK := sustainedFrom(all, int(delivered(95)), linked, end)
	t.Logf("budget 100/s over gateways (50 ms each way), cut %v: most in any 1 s window %d connected, %d cut (bound 154), "+
		"%d from the heal, %d once settled (bound 104); b on its safe share %.1fs after the cut, delivering %.1f/s, a %.1f/s; "+
		"gateways up %.1fs after the heal; from then ≥ 95/s handed out for good after %.2fs (%v), ≥ %.0f/s delivered "+
		"in every 1 s window from %.2fs (%v); shares back at 50/50 after %.1fs",
		cutFor, before, during, after, afterSettled, bSafe.Sub(cut).Seconds(), bRate, aRate, linked.Sub(heal).Seconds(),
		handedAt.Sub(linked).Seconds(), handedOK, delivered(95), usedAt.Sub(linked).Seconds(), usedOK, settled.Sub(linked).Seconds())
	t.Logf("per second a/b from the cut: %s", timeline(aAts, bAts, cut, end))
	logWrites(t, time.Since(began), a, b)
	t.Logf("shares every 0.5 s a/b from the cut: %s", shareLine(ss, cut, end, 500*time.Millisecond))
	t.Logf("shares every 0.1 s a/b from the gateways' return: %s", shareLine(ss, linked, settled, 100*time.Millisecond))
	t.Logf("b's renewals with a lease from the gateways' return, s (share): %s", renewals(ss, linked, settled))
	if most := max(during, after); most > 150+connectedBound+spread(150) {
		t.Errorf("the upstream saw %d in a 1 s window while cut, %d after the heal; partition bound %d + spread %d",
			during, after, 150+connectedBound, spread(150))
	}
	if before > 100+connectedBound+spread(100) || afterSettled > 100+connectedBound+spread(100) {
		t.Errorf("the upstream saw %d in a 1 s window before the cut, %d once the shares settled; connected bound %d + spread %d",
			before, afterSettled, 100+connectedBound, spread(100))
	}
	if bSafe.Sub(cut) > lease+renew+500*time.Millisecond {
		t.Errorf("b went on its safe share %v after the cut; want within its lease (renewed ≤ a renewal before)", bSafe.Sub(cut))
	}
	if s, ok := sharesIn(ss, bSafe.Add(100*time.Millisecond), heal, -1, 50); !ok {
		t.Errorf("b cut off ran on %v/s at %v after the cut; want its safe share, 50/s", s.b, s.at.Sub(cut))
	}
	if s, ok := sharesIn(ss, full, heal, 100, -1); !ok {
		t.Errorf("a ran on %v/s at %v after the cut, after b's lease expired; want the budget, 100/s", s.a, s.at.Sub(cut))
	}
	if bRate > 51 || (regionsSoak() && bRate < 50*0.95) {
		t.Errorf("b cut off delivered %.1f/s on its safe share; want 50/s", bRate)
	}
	if regionsSoak() && aRate < 95 {
		t.Errorf("a delivered %.1f/s once b's lease expired; want the budget, 100/s", aRate)
	}
	// b's first renewal after the gateways' return (within a renew period, or at once when its
	// watch of the record comes back first) gets what a's holders do not hold: nothing. a's
	// holders see that write (their watch) and renew lower at once, each counting its former
	// share only for the 200 ms of slots it reserved ahead (leaseLingers); b's holders see a's
	// writes and renew when that ends (Lease.Retry), or at their next period without a watch.
	// So within 2·renew and b's two renewals over the gateway, each a read and a write, and one
	// of them a race lost to a's writes: 2.6 s at renew 1 s (docs/design/regions.md, "Heal").
	// The watches do not enter it: a supercluster of two regions has no JetStream meta leader
	// while they are cut apart and for seconds after, and a watch cannot start without one.
	// The heal time is asserted in make soak; in make test it is logged (above): on a loaded
	// machine renewals over the gateway fail for seconds after its return (one CI run under
	// load 10: 4 s of failed renewals, handed out again after 7.3 s), which the upstream's
	// bounds, asserted above, never depend on.
	heals := 2*renew + 3*2*2*gatewayLatency
	if regionsSoak() && (!handedOK || handedAt.Sub(linked) > heals) {
		t.Errorf("≥ 95/s handed out for good %v after the gateways were up again (%v); want within %v",
			handedAt.Sub(linked), handedOK, heals)
	} else if !handedOK {
		t.Errorf("≥ 95/s never handed out for good after the gateways were up again")
	}
	if regionsSoak() && (!usedOK || usedAt.Sub(linked) > heals) {
		t.Errorf("≥ 95/s delivered in every 1 s window from %v after the gateways were up again (%v); want within %v",
			usedAt.Sub(linked), usedOK, heals)
	}
}

// TestRegionsGatewayIndependent is the baseline of the figures above (make soak only): the same
// two regions and backlogs with the queue not global, so each region enforces the whole
// 100/s on its own, as two deployments without regions do. The upstream sees the sum.
func TestRegionsGatewayIndependent(t *testing.T) {
	if !regionsSoak() {
		t.Skip("the baseline runs in make soak (SLUICE_REGIONS_SOAK=1)")
	}
	h := newHarness(t)
	sc := testenv.NewSupercluster(t, gatewayLatency, "a", "b")
	for _, name := range []string{"a", "b"} {
		r := newGatewayRegion(t, h.ctx, name, sc)
		workertest.Publish(t, r.qs, "llm", 1500, false)
		spec := h.spec("llm", 100)
		spec.Concurrency = 16
		rs := testenv.Redis(t)
		deps := worker.Deps{Queues: r.qs, Schedule: leaky.NewRedis(rs.Client, leaky.RedisConfig{Prefix: testenv.Name(t) + ":"}),
			Registerer: prometheus.NewRegistry()}
		p, err := worker.New(deps, []worker.QueueConfig{spec})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	h.up.WaitCount(t, 30*time.Second, "6 s of deliveries", func(int) bool {
		all := arrivalTimes(h.up, nil)
		return len(all) > 0 && time.Since(all[0]) >= 6*time.Second
	})
	all := arrivalTimes(h.up, nil)
	most, mean := maxWindow(all, all[0], all[0].Add(5*time.Second)), rateIn(all, all[0].Add(time.Second), all[0].Add(6*time.Second))
	t.Logf("two independent regions, 100/s each: most in any 1 s window %d, %.1f/s on average (%.0f%% of the budget)", most, mean, mean)
	if most <= 150 {
		t.Errorf("two regions without global saw at most %d in a 1 s window; want about 200, the sum of their rates", most)
	}
}

// TestRegionsGatewayHomeKilled: the home region's server (a nats-server process holding a's
// queues and the coordinator's bucket) is SIGKILLed while both regions drain a global queue of
// 100/s, and started again on its store 3 s later. Region b, cut off from the bucket, runs on
// its lease, then on its safe share (50/s); region a delivers nothing while its server is
// down. After the restart both renew again and every job of both regions is delivered. No 1 s
// window exceeds the bound for a lost coordinator, B + (R−1)·σ + R·(1 + b) = 154.
func TestRegionsGatewayHomeKilled(t *testing.T) {
	gatewayParallel(t)
	const nA, nB = 600, 600
	h := newHarness(t)
	sc := testenv.NewSuperclusterHomeProc(t, gatewayLatency, "a", "b")
	a, b := newGatewayRegion(t, h.ctx, "a", sc), newGatewayRegion(t, h.ctx, "b", sc)
	aIDs := idSet(workertest.Publish(t, a.qs, "llm", nA, false))
	bIDs := idSet(workertest.Publish(t, b.qs, "llm", nB, false))
	regs := map[string][]*prometheus.Registry{"a": a.runFast(t, h), "b": b.runFast(t, h)}
	gauge := func(name string) (a, b float64) {
		return regionGauge(t, regs["a"], name), regionGauge(t, regs["b"], name)
	}
	testenv.WaitFor(t, 30*time.Second, "both regions on leases of 50/s", func() bool {
		shareA, shareB := gauge("sluice_region_share")
		safeA, safeB := gauge("sluice_region_on_safe_share")
		return shareA == 50 && shareB == 50 && safeA == 0 && safeB == 0
	})
	killed := time.Now()
	sc.HomeProc.Kill()
	testenv.WaitFor(t, 10*time.Second, "b on its safe share", func() bool { _, b := gauge("sluice_region_on_safe_share"); return b == 1 })
	bSafe := time.Now()
	testenv.WaitFor(t, 10*time.Second, "3 s of the home region down", func() bool { return time.Since(killed) >= 3*time.Second })
	restarted := time.Now()
	sc.HomeProc.Start()
	testenv.WaitFor(t, 30*time.Second, "both regions on leases again", func() bool {
		safeA, safeB := gauge("sluice_region_on_safe_share")
		return safeA == 0 && safeB == 0
	})
	resumed := time.Now()
	h.up.WaitCount(t, 60*time.Second, "every job of both regions delivered", func(int) bool {
		return len(arrivalTimes(h.up, aIDs)) >= nA && len(arrivalTimes(h.up, bIDs)) >= nB
	})
	end := time.Now()
	all, sets := arrivalSets(h.up, aIDs, bIDs)
	aAts, bAts := sets[0], sets[1]
	most := maxWindow(all, all[0], end)
	aDown := rateIn(aAts, killed.Add(500*time.Millisecond), restarted)
	bOnSafe := rateIn(bAts, bSafe.Add(200*time.Millisecond), restarted)
	t.Logf("budget 100/s over gateways, the home region's server SIGKILLed for 3 s: most in any 1 s window %d (bound 154); "+
		"b on its safe share %.1fs after the kill, delivering %.1f/s; a %.1f/s while down; both on leases %.1fs after the restart; "+
		"all %d jobs delivered %.1fs after it (%d arrivals)",
		most, bSafe.Sub(killed).Seconds(), bOnSafe, aDown, resumed.Sub(restarted).Seconds(), nA+nB,
		end.Sub(restarted).Seconds(), len(all))
	t.Logf("per second a/b: %s", timeline(aAts, bAts, all[0], end))
	if most > 150+connectedBound+spread(150) {
		t.Errorf("the upstream saw %d in a 1 s window; the lost coordinator's bound is 154 + spread %d", most, spread(150))
	}
	if bSafe.Sub(killed) > 2*time.Second+500*time.Millisecond+500*time.Millisecond {
		t.Errorf("b went on its safe share %v after the kill; want within its lease and a renewal", bSafe.Sub(killed))
	}
	if bOnSafe > 51 {
		t.Errorf("b delivered %.1f/s on its safe share; want 50/s", bOnSafe)
	}
	if aDown > 5 {
		t.Errorf("a delivered %.1f/s with its server down", aDown)
	}
}
