package main

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/worker/workertest"
	"github.com/sluice-rl/sluice/queue"
)

// TestPauseStopsEveryWorkerProcess: an operator's pause (the control the admin API writes)
// stops deliveries on every worker process within a second, a runtime rate applies to all of
// them, and resume restarts them.
func TestPauseStopsEveryWorkerProcess(t *testing.T) {
	c := newCluster(t)
	up := startUpstream(t)
	path := c.config(c.queueYAMLTo(up.URL, "ctl", "40/s", "concurrency: 8"))
	workertest.Publish(t, c.qs, "ctl", 400, true)
	for range 3 {
		c.spawn(path)
	}
	up.WaitCount(t, 30*time.Second, "the drain to start", func(n int) bool { return n >= 20 })

	if _, err := c.qs.SetControl(c.ctx, "ctl", func(ctl *queue.Control) { ctl.Paused = true }); err != nil {
		t.Fatal(err)
	}
	pausedAt := time.Now()
	// Deliveries already on their way may land; after a second, nothing more may. The waits
	// are the spans measured, not waits for an event.
	<-time.After(time.Until(pausedAt.Add(time.Second)))
	atSettle := len(up.Arrivals("/q/ctl"))
	<-time.After(2 * time.Second)
	if n := len(up.Arrivals("/q/ctl")); n != atSettle {
		t.Fatalf("%d deliveries while paused (more than a second after the pause), by 3 worker processes", n-atSettle)
	}

	// A runtime rate, then resume: the drain goes on at 10/s on all three.
	if _, err := c.qs.SetControl(c.ctx, "ctl", func(ctl *queue.Control) { ctl.Rate = "10/s"; ctl.Paused = false }); err != nil {
		t.Fatal(err)
	}
	resumedAt := time.Now()
	up.WaitCount(t, 30*time.Second, "deliveries after resume", func(int) bool { return len(up.Arrivals("/q/ctl")) >= atSettle+30 })
	var after []time.Time
	for _, a := range up.Arrivals("/q/ctl") {
		if a.At.After(resumedAt.Add(500 * time.Millisecond)) {
			after = append(after, a.At)
		}
	}
	if r := workertest.Rate(after); r > 10*1.1 || r < 10*0.8 {
		t.Errorf("rate after the runtime change to 10/s: %.2f/s (%d deliveries)", r, len(after))
	}
	t.Logf("paused: 0 deliveries in 2 s on 3 workers; runtime rate 10/s: %.2f/s", workertest.Rate(after))
}

// A worker that starts while an operator has paused its queue delivers nothing until the
// queue is resumed: it reads the controls before it takes a slot.
func TestWorkerStartedWhilePausedWaits(t *testing.T) {
	c := newCluster(t)
	up := startUpstream(t)
	path := c.config(c.queueYAMLTo(up.URL, "held", "100/s", "concurrency: 8"))
	workertest.Publish(t, c.qs, "held", 50, true)
	if _, err := c.qs.SetControl(c.ctx, "held", func(ctl *queue.Control) { ctl.Paused = true }); err != nil {
		t.Fatal(err)
	}
	var procs []*proc
	for range 3 {
		p := c.spawn(path)
		procs = append(procs, p)
	}
	for _, p := range procs {
		p.waitReady()
	}
	<-time.After(time.Second) // the span in which nothing may arrive, not a wait for an event
	if n := len(up.Arrivals("/q/held")); n != 0 {
		t.Fatalf("%d deliveries by workers started while the queue was paused", n)
	}
	if _, err := c.qs.SetControl(c.ctx, "held", func(ctl *queue.Control) { ctl.Paused = false }); err != nil {
		t.Fatal(err)
	}
	up.WaitCount(t, 30*time.Second, "every job after the resume", func(int) bool { return len(up.Arrivals("/q/held")) >= 50 })
}
