package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/worker/workertest"
	"github.com/sluice-rl/sluice/queue"
)

// publishTenantLevel publishes n direct jobs of priority p of the tenant whose X-Tenant value
// is value, 8 at a time, and returns their ids.
func (c *cluster) publishTenantLevel(name, value string, p queue.Priority, n int) map[string]bool {
	c.t.Helper()
	tenant := c.qs.TenantID([]byte(value))
	return c.publishEach(n, func(i int) *queue.Job {
		return &queue.Job{Queue: name, Direct: true, Tenant: tenant, Priority: p, Body: fmt.Appendf(nil, "%s-%s-%d", value, p, i)}
	})
}

// TestFairPriorityWithinTenantShare: a fair 100/s queue drained by two worker processes, tenant
// B with 400 normal jobs, tenant A with 300 low ones; once the drain is under way A publishes
// 20 high jobs. A's high jobs overtake its waiting low ones (only the starvation guard's low
// jobs, and those already handed to the workers, arrive among them), A's low jobs are never
// kept out for more than 2 × (starveAfter-1) of A's deliveries in a row (two workers), and B's
// share stays half of the deliveries while both have jobs, during the high jobs too.
func TestFairPriorityWithinTenantShare(t *testing.T) {
	const (
		name        = "fairprio"
		rate        = 100
		highs       = 20
		starveAfter = 8 // package fair's
	)
	c := newCluster(t)
	path := c.config(c.queueYAML(name, fmt.Sprintf("%d/s", rate), "tenant: header:X-Tenant", "fair: true", "concurrency: 8"))
	bJobs := c.publishTenantLevel(name, "B", queue.PriorityNormal, 400)
	aLow := c.publishTenantLevel(name, "A", queue.PriorityLow, 300)
	for range 2 {
		c.spawn(path)
	}
	c.up.WaitCount(t, 20*time.Second, "the drain to be under way", func(n int) bool { return n >= 60 })
	start := time.Now()
	aHigh := c.publishTenantLevel(name, "A", queue.PriorityHigh, highs)
	published := time.Now()
	c.up.WaitCount(t, 30*time.Second, "every high job", func(int) bool {
		n := 0
		for id := range c.up.PerID() {
			if aHigh[id] {
				n++
			}
		}
		return n == highs
	})
	m := measureLevels(c.up.Arrivals(), aLow, aHigh, bJobs)
	if m.aAll >= 300 || m.bAll >= 380 {
		t.Fatalf("A had %d and B %d jobs delivered when A's high ones were: one ran short of jobs", m.aAll, m.bAll)
	}
	// What may arrive among A's high jobs of its low ones: the guard's (1 of every
	// starveAfter) and those the workers already held when the high jobs reached the delivery
	// stream (up to concurrency each).
	bound := highs/(starveAfter-1) + 1 + 2*8
	bShare, bWindow := float64(m.bAll)/float64(m.aAll+m.bAll), float64(m.bInWindow)/float64(m.inWindow)
	t.Logf("%d high jobs of A published in %v: first arrived %v after, last %v after; %d of A's low jobs among them (bound %d), "+
		"longest run of A's high without a low %d; B got %.3f of %d deliveries while both had jobs, %.3f of the %d while A's high ones arrived",
		highs, published.Sub(start), m.first.Sub(start), m.last.Sub(start), m.lowsAmong, bound, m.longest, bShare, m.aAll+m.bAll, bWindow, m.inWindow)
	if m.lowsAmong > bound {
		t.Errorf("%d of A's low jobs arrived among its high ones, want ≤ %d (in arrival order: ~250)", m.lowsAmong, bound)
	}
	if m.lowsAmong == 0 {
		t.Errorf("none of A's low jobs arrived among its %d high ones: the starvation guard gave none a turn", highs)
	}
	if m.longest > 2*(starveAfter-1) {
		t.Errorf("%d of A's high jobs in a row without a low one, want ≤ %d", m.longest, 2*(starveAfter-1))
	}
	if bShare < 0.47 || bShare > 0.53 {
		t.Errorf("B got %.3f of the deliveries while both had jobs, want 0.5 ±0.03", bShare)
	}
	if bWindow < 0.4 || bWindow > 0.6 {
		t.Errorf("B got %.3f of the deliveries while A's high jobs arrived, want 0.5 ±0.1", bWindow)
	}
}

// levelsSeen is what TestFairPriorityWithinTenantShare reads of the arrivals.
type levelsSeen struct {
	first, last time.Time // A's first and last high job's arrivals
	// lowsAmong and bInWindow are A's low jobs and B's jobs among the inWindow arrivals from
	// first to last; longest is the longest run of A's high jobs without one of its low ones.
	lowsAmong, bInWindow, inWindow, longest int
	aAll, bAll                              int // A's and B's arrivals in all
}

// measureLevels reads arrivals, of A's low and high jobs and B's jobs.
func measureLevels(arrivals []workertest.Arrival, aLow, aHigh, bJobs map[string]bool) levelsSeen {
	var m levelsSeen
	for _, a := range arrivals {
		if aHigh[a.ID] {
			if m.first.IsZero() {
				m.first = a.At
			}
			m.last = a.At
		}
	}
	run := 0
	for _, a := range arrivals {
		inWindow := !a.At.Before(m.first) && !a.At.After(m.last)
		if inWindow {
			m.inWindow++
		}
		switch {
		case aHigh[a.ID]:
			m.aAll++
			run++
			m.longest = max(m.longest, run)
		case aLow[a.ID]:
			m.aAll++
			run = 0
			if inWindow {
				m.lowsAmong++
			}
		case bJobs[a.ID]:
			m.bAll++
			if inWindow {
				m.bInWindow++
			}
		}
	}
	return m
}
