package main

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// Bounds of TestMaxInFlightRedisStall (issue 39): the cap is used in full again within
// stallRefill of SIGCONT.
const stallRefill = time.Second

// TestMaxInFlightRedisStall (issue 39): max_in_flight: 5 over 3 worker processes of
// concurrency 8, an upstream taking 300ms a request, and redis-server SIGSTOPped for 4s while
// the queue drains, then SIGCONTed. Its data survives, so no fence is due. During the stall
// the releases of the deliveries that ended fail, and the place takes time out; on SIGCONT
// redis-server runs the takes it had received and grants places nobody holds. Both must be
// released once Redis answers again, not left to expire with their hold (timeout 2s + 5s + the
// Reuser's 1s). Measured at the upstream: 5 requests open at once again within stallRefill of
// SIGCONT, and never more than 5. Before (issue 39): 8.0s here, the hold of the places granted
// on resume (the fault run saw 1 of 5 places used for 10.7s after a 3.9s stall).
func TestMaxInFlightRedisStall(t *testing.T) {
	c := newCluster(t)
	const name, limit, took, stall = "stalled", 5, 300 * time.Millisecond, 4 * time.Second
	oc := newOpenCounter(took)
	var (
		mu    sync.Mutex
		fulls []time.Time // the instants an arrival found the cap in full use
	)
	c.up.Respond(func(a workertest.Arrival, i int) workertest.Reply {
		r := oc.respond(a, i)
		if oc.open.Load() >= limit {
			mu.Lock()
			fulls = append(fulls, time.Now())
			mu.Unlock()
		}
		return r
	})
	fullSince := func(from time.Time) (time.Time, bool) {
		mu.Lock()
		defer mu.Unlock()
		for _, at := range fulls {
			if at.After(from) {
				return at, true
			}
		}
		return time.Time{}, false
	}
	path := c.config(c.queueYAML(name, "200/s", "concurrency: 8", fmt.Sprintf("max_in_flight: %d", limit)))
	workertest.Publish(t, c.qs, name, 400, true)
	for range 3 {
		c.spawn(path)
	}
	c.up.WaitCount(t, 30*time.Second, "the drain to reach its pace", func(k int) bool { return k >= 30 })
	start := time.Now()
	testenv.WaitFor(t, 10*time.Second, "the cap in full use before the stall", func() bool {
		_, ok := fullSince(start)
		return ok
	})
	before := oc.max.Load()

	c.redis.Pause() // with requests open at the upstream: their places cannot be released
	stopped := time.Now()
	time.Sleep(stall) // the stall itself: the stimulus, not a wait for anything
	c.redis.Resume()
	resumed := time.Now()
	atStall := c.up.Count()

	var full time.Time
	testenv.WaitFor(t, 15*time.Second, "the cap in full use after SIGCONT", func() bool {
		var ok bool
		full, ok = fullSince(resumed)
		return ok
	})
	refill := full.Sub(resumed)
	var during int
	for _, a := range c.up.Arrivals() {
		if a.At.After(stopped) && a.At.Before(resumed) {
			during++
		}
	}
	t.Logf("most open at once: %d before the stall, %d overall (cap %d); %d deliveries during the %v stall; "+
		"%d open again %v after SIGCONT (bound %v); %d deliveries by then",
		before, oc.max.Load(), limit, during, resumed.Sub(stopped).Round(10*time.Millisecond),
		limit, refill.Round(time.Millisecond), stallRefill, c.up.Count()-atStall)
	if m := oc.max.Load(); m > limit {
		t.Errorf("%d requests open at the upstream at once, want at most %d", m, limit)
	}
	if refill > stallRefill {
		t.Errorf("the cap was in full use again %v after SIGCONT, want within %v", refill.Round(time.Millisecond), stallRefill)
	}
}
