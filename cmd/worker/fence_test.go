package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// TestMaxInFlightRedisRestarts (issue 39): max_in_flight: 5 over 3 worker processes of
// concurrency 8, an upstream taking 300ms a request, and redis-server, without persistence,
// SIGKILLed and restarted at once 3 times 2s apart while the queue drains. Before the fence,
// each restart handed out the cap's 5 places again while the deliveries holding the lost ones
// were still open (5 to 10 open at once). Now: never more than 5 requests open at the
// upstream; each worker counts the losses it saw (sluice_place_store_resets_total); and
// deliveries resume within the queue's timeout (2s) + 3s, plus a second for this shared
// machine, of the last restart.
func TestMaxInFlightRedisRestarts(t *testing.T) {
	c := newCluster(t)
	const name, limit, took = "fenced", 5, 300 * time.Millisecond
	oc := newOpenCounter(took)
	c.up.Respond(oc.respond)
	path := c.config(c.queueYAML(name, "200/s", "concurrency: 8", fmt.Sprintf("max_in_flight: %d", limit)))
	workertest.Publish(t, c.qs, name, 300, true)
	procs := []*proc{c.spawn(path), c.spawn(path), c.spawn(path)}
	c.up.WaitCount(t, 30*time.Second, "the drain to reach its pace", func(k int) bool { return k >= 40 })
	before := oc.max.Load()

	var restarts []time.Time
	for i := range 3 {
		if i > 0 {
			time.Sleep(2 * time.Second)
		}
		c.redis.Stop() // SIGKILL, with requests open at the upstream
		c.redis.Start()
		restarts = append(restarts, time.Now())
	}
	last := restarts[len(restarts)-1]
	base := c.up.Count()
	c.up.WaitCount(t, 30*time.Second, "30 deliveries after the last restart", func(k int) bool { return k >= base+30 })

	var resumed time.Time
	var during int
	for _, a := range c.up.Arrivals() {
		if a.At.After(last) && resumed.IsZero() {
			resumed = a.At
		}
		if a.At.After(restarts[0]) && a.At.Before(last) {
			during++
		}
	}
	var resets []float64
	for _, p := range procs {
		v, _ := metricValue(p.metrics(), "sluice_place_store_resets_total")
		resets = append(resets, v)
	}
	t.Logf("most open at once: %d before the restarts, %d overall (cap %d); %d deliveries between the first and last restart; "+
		"resumed %v after the last; resets seen by each worker %v",
		before, oc.max.Load(), limit, during, resumed.Sub(last).Round(10*time.Millisecond), resets)
	if m := oc.max.Load(); m > limit {
		t.Errorf("%d requests open at the upstream at once, want at most %d", m, limit)
	}
	if d := resumed.Sub(last); d > 2*time.Second+3*time.Second+time.Second {
		t.Errorf("deliveries resumed %v after the last restart, want within the timeout (2s) + 3s + 1s", d)
	}
	for i, v := range resets {
		if v < 1 {
			t.Errorf("worker %d counted %v resets of the place store, want at least 1", i, v)
		}
	}
}
