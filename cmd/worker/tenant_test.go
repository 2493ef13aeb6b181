package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
	"github.com/sluice-rl/sluice/queue"
)

// TestPauseScopeTenant: on a fair 20/s queue with pause_scope: tenant drained by two worker
// processes, tenant A's upstream key answers 429 with Retry-After: 5 for 5s. A is paused on
// both workers — none of its jobs reaches the upstream after the first 429 but within the
// workers' poll of the pauses — while tenant B's jobs keep flowing at >= 90% of the queue's
// rate; A resumes once its pause ends, and every delivery of every job went out as attempt 1.
func TestPauseScopeTenant(t *testing.T) {
	c := newCluster(t)
	const name, rate, refuseFor = "tenantpause", 20, 5 * time.Second
	path := c.config(c.queueYAML(name, fmt.Sprintf("%d/s", rate), "tenant: header:X-Tenant", "fair: true",
		"concurrency: 8", "pause_scope: tenant"))
	var (
		mu        sync.Mutex
		firstA    time.Time // the first 429
		refusedAt []time.Time
		refusedID = map[string]bool{}
	)
	isA := func(a workertest.Arrival) bool { return bytes.HasPrefix(a.Body, []byte("A-")) }
	c.up.Respond(func(a workertest.Arrival, _ int) workertest.Reply {
		if !isA(a) {
			return workertest.Reply{}
		}
		mu.Lock()
		defer mu.Unlock()
		if firstA.IsZero() {
			firstA = a.At
		}
		if a.At.Sub(firstA) < refuseFor { // A's key is over its limit for 5s
			refusedAt = append(refusedAt, a.At)
			refusedID[a.ID] = true
			return workertest.Reply{Status: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"5"}}}
		}
		return workertest.Reply{}
	})
	const nA, nB = 40, 240
	c.publishJobs(name, nA+nB, func(i int) string {
		if i%7 == 0 && i/7 < nA {
			return "A"
		}
		return "B"
	})
	c.spawn(path)
	c.spawn(path)
	c.up.WaitCount(t, 60*time.Second, "every job, and again each one refused", func(n int) bool {
		mu.Lock()
		defer mu.Unlock()
		return c.up.Distinct() == nA+nB && n >= nA+nB+len(refusedAt)
	})
	mu.Lock()
	t0, refused := firstA, append([]time.Time(nil), refusedAt...)
	mu.Unlock()
	if t0.IsZero() {
		t.Fatal("no job of A reached the upstream")
	}
	last := refused[len(refused)-1]
	var aAfter, bDuring []time.Time
	for _, a := range c.up.Arrivals() {
		if a.Attempt != 1 {
			t.Errorf("job %s went out as attempt %d, want 1: a 429 and a tenant's pause spend none", a.ID, a.Attempt)
		}
		switch {
		case isA(a) && a.At.After(last):
			aAfter = append(aAfter, a.At)
		case !isA(a) && a.At.After(t0.Add(500*time.Millisecond)) && a.At.Before(t0.Add(4500*time.Millisecond)):
			bDuring = append(bDuring, a.At)
		}
	}
	t.Logf("A: first 429 at +0, %d refused, the last at +%v; next A delivery at +%v; B delivered %d in the 4s within the pause",
		len(refused), last.Sub(t0).Round(time.Millisecond), firstAfter(aAfter).Sub(t0).Round(time.Millisecond), len(bDuring))
	// Only what was on its way before a worker learned of the pause reaches the upstream.
	if lag := last.Sub(t0); lag > 500*time.Millisecond {
		t.Errorf("A's jobs reached the upstream until %v after its first 429, want none after the pause is known (< 500ms)", lag)
	}
	if next := firstAfter(aAfter); next.Sub(last) < refuseFor-100*time.Millisecond || next.Sub(last) > refuseFor+2*time.Second {
		t.Errorf("A resumed %v after its last 429 with Retry-After: 5, want 5s to 7s", next.Sub(last))
	}
	if want := int(0.9 * rate * 4); len(bDuring) < want {
		t.Errorf("B got %d deliveries in 4s while A was paused, want >= %d (90%% of the queue's rate)", len(bDuring), want)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, n := range c.up.PerID() {
		if n > 1 && !refusedID[id] {
			t.Errorf("job %s delivered %d times without a 429", id, n)
		}
	}
}

func firstAfter(ts []time.Time) time.Time {
	var first time.Time
	for _, at := range ts {
		if first.IsZero() || at.Before(first) {
			first = at
		}
	}
	return first
}

// TestAdaptivePerTenant: an upstream that takes 5/s from key A and 20/s from key B (token
// buckets of burst 5, 429 with Retry-After: 1 beyond), behind a fair adaptive 50/s queue with
// pause_scope: tenant drained by 2 worker processes. Each tenant learns its own rate: over the
// last 20 s of a 60 s drain, A >= 4.25/s and B >= 17/s successes, and at most 3% of the
// deliveries answered 429. A run that misses is repeated once, as the accuracy tests are.
func TestAdaptivePerTenant(t *testing.T) {
	t.Parallel() // long, slow-paced, sharing no rate: runs beside the other such tests (see Makefile, TIMED)
	c := newCluster(t)
	up := startUpstream(t)
	for try := 1; try <= 2; try++ {
		problems := adaptivePerTenantRun(t, c, up, fmt.Sprintf("tenantadapt%d", try))
		if len(problems) == 0 {
			return
		}
		if try == 2 {
			for _, p := range problems {
				t.Error(p)
			}
		} else {
			t.Logf("try %d missed: %v", try, problems)
		}
	}
}

func adaptivePerTenantRun(t *testing.T, c *cluster, up *upstream, name string) (problems []string) {
	// Deferred jobs, as a rule would defer them: A's to the upstream's /limited/5/ and B's to
	// its /limited/20/, two keys it limits apart.
	c.upstreamURL = up.URL
	path := c.config(c.queueYAMLTo(up.URL, name, "50/s", "tenant: header:X-Tenant", "fair: true",
		"concurrency: 16", "adaptive: true", "pause_scope: tenant"))
	const nA, nB = 400, 1400
	paths := map[string]string{"A": "/limited/5/" + name, "B": "/limited/20/" + name}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		tenantOf = map[string]string{} // job id → tenant
	)
	sem := make(chan struct{}, 8)
	for i := range nA + nB {
		tenant := "B"
		if i < 2*nA && i%2 == 0 { // A's jobs among B's first ones, then B's alone
			tenant = "A"
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
			defer cancel()
			r, err := c.qs.Publish(ctx, &queue.Job{Queue: name, Tenant: c.qs.TenantID([]byte(tenant)),
				Method: http.MethodPost, Path: paths[tenant], Body: fmt.Appendf(nil, "%s-%d", tenant, i)})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			tenantOf[r.ID] = tenant
			mu.Unlock()
		}()
	}
	wg.Wait()
	start := time.Now()
	procs := []*proc{c.spawn(path), c.spawn(path)}
	defer func() {
		for _, p := range procs {
			p.kill()
		}
	}()
	const drain, measured = 60 * time.Second, 20 * time.Second
	// The drain is measured over a fixed time: poll the clock, not the arrivals.
	testenv.WaitFor(t, drain+time.Minute, "60 s of drain", func() bool { return time.Since(start) > drain })
	from := start.Add(drain - measured)
	if os.Getenv("SLUICE_ADAPTIVE_TRACE") == "1" {
		per := map[int]map[string]int{}
		for _, a := range append(up.Arrivals(paths["A"]), up.Arrivals(paths["B"])...) {
			sec := int(a.At.Sub(start).Seconds())
			if per[sec] == nil {
				per[sec] = map[string]int{}
			}
			per[sec][fmt.Sprint(tenantOf[a.ID], a.Status)]++
		}
		for sec := range int(drain.Seconds()) + 1 {
			t.Logf("second %2d: %v", sec, per[sec])
		}
	}
	ok := map[string]int{}
	var limited, all int
	for _, a := range append(up.Arrivals(paths["A"]), up.Arrivals(paths["B"])...) {
		if a.At.Before(from) {
			continue
		}
		all++
		switch a.Status {
		case http.StatusOK:
			ok[tenantOf[a.ID]]++
		case http.StatusTooManyRequests:
			limited++
		}
	}
	rateA, rateB := float64(ok["A"])/measured.Seconds(), float64(ok["B"])/measured.Seconds()
	share := float64(limited) / float64(max(all, 1))
	t.Logf("%s, last %v of %v: A %.2f/s (takes 5/s), B %.2f/s (takes 20/s), %.1f%% answered 429 (%d of %d)",
		name, measured, drain, rateA, rateB, 100*share, limited, all)
	if rateA < 4.25 {
		problems = append(problems, fmt.Sprintf("A %.2f succeeded/s, want >= 4.25 (85%% of 5/s)", rateA))
	}
	if rateB < 17 {
		problems = append(problems, fmt.Sprintf("B %.2f succeeded/s, want >= 17 (85%% of 20/s)", rateB))
	}
	if share > 0.03 {
		problems = append(problems, fmt.Sprintf("%.1f%% of deliveries answered 429, want at most 3%%", 100*share))
	}
	return problems
}
