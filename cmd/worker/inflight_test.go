package main

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// openCounter counts the requests open at an upstream that answers each after d, with its
// high-water mark. A request is open from its arrival until its answer is due, even when the
// client went away first (a killed worker), as the upstream would still be working on it.
type openCounter struct {
	d        time.Duration
	open     atomic.Int64
	max      atomic.Int64
	mu       sync.Mutex
	byTenant map[string]int64 // open per tenant (the body's prefix up to '-')
	maxT     map[string]int64
}

func newOpenCounter(d time.Duration) *openCounter {
	return &openCounter{d: d, byTenant: map[string]int64{}, maxT: map[string]int64{}}
}

func (o *openCounter) respond(a workertest.Arrival, _ int) workertest.Reply {
	tenant := string(a.Body[:max(bytes.IndexByte(a.Body, '-'), 0)])
	o.mu.Lock()
	o.max.Store(max(o.max.Load(), o.open.Add(1)))
	o.byTenant[tenant]++
	o.maxT[tenant] = max(o.maxT[tenant], o.byTenant[tenant])
	o.mu.Unlock()
	done := make(chan struct{})
	time.AfterFunc(o.d, func() {
		o.mu.Lock()
		o.byTenant[tenant]--
		o.mu.Unlock()
		o.open.Add(-1)
		close(done)
	})
	return workertest.Reply{Block: done}
}

// TestMaxInFlightAcrossWorkers: max_in_flight: 5 over 3 worker processes of concurrency 8, an
// upstream taking 300ms a request: never more than 5 requests open at the upstream, throughput
// >= 95% of 5 / 0.3s; a worker SIGKILLed mid-request does not break the cap, and its places
// come back within the queue's timeout plus the documented margin.
func TestMaxInFlightAcrossWorkers(t *testing.T) {
	c := newCluster(t)
	const name, limit, took = "capped", 5, 300 * time.Millisecond
	oc := newOpenCounter(took)
	c.up.Respond(oc.respond)
	path := c.config(c.queueYAML(name, "200/s", "concurrency: 8", fmt.Sprintf("max_in_flight: %d", limit)))
	// Enough jobs that the two workers left are still delivering well after the killed one's
	// places are due back (8.5 s after the kill): 240 left none there when the killed worker
	// held no place at the kill and the others drained the rest in 8.4 s.
	const n = 360
	workertest.Publish(t, c.qs, name, n, true)
	procs := []*proc{c.spawn(path), c.spawn(path), c.spawn(path)}

	// Steady state: 100 deliveries at the cap's pace.
	c.up.WaitCount(t, 60*time.Second, "100 deliveries", func(k int) bool { return k >= 100 })
	arr := c.up.Arrivals()
	steady := arr[20:100] // past the start-up of the three workers
	rate := float64(len(steady)-1) / steady[len(steady)-1].At.Sub(steady[0].At).Seconds()
	ideal := float64(limit) / took.Seconds()
	t.Logf("steady: %.2f deliveries/s, %.1f%% of %d/%v; at most %d open", rate, 100*rate/ideal, limit, took, oc.max.Load())
	if rate < 0.95*ideal {
		t.Errorf("throughput %.2f/s, want >= 95%% of %.2f/s", rate, ideal)
	}

	// Kill a worker with requests open: the cap holds while its places are held for it.
	procs[0].kill()
	killed := time.Now()
	c.up.WaitCount(t, 90*time.Second, "every job", func(int) bool { return c.up.Distinct() == n })
	if m := oc.max.Load(); m > limit {
		t.Errorf("%d requests open at the upstream at once, want at most %d", m, limit)
	}
	// Its places came back: once the queue's timeout (2s) plus the margin (5s, and the 1s a
	// worker takes its places for beyond it to give them to its next deliveries) had passed
	// after the kill, the two workers left delivered at the cap's pace again.
	back := killed.Add(2*time.Second + 6*time.Second + 500*time.Millisecond)
	var after []time.Time
	for _, a := range c.up.Arrivals() {
		if a.At.After(back) {
			after = append(after, a.At)
		}
	}
	if len(after) < 20 {
		t.Fatalf("only %d deliveries after the dead worker's places were due back; publish more jobs", len(after))
	}
	rate = float64(len(after)-1) / after[len(after)-1].Sub(after[0]).Seconds()
	t.Logf("after the kill, once its places were due back: %.2f deliveries/s over %d", rate, len(after))
	if rate < 0.9*ideal {
		t.Errorf("after the killed worker's places were due back: %.2f/s, want >= 90%% of %.2f/s: its places did not return", rate, ideal)
	}
}

// TestTenantInFlightAcrossWorkers: tenant_in_flight: 2 on a fair queue of three tenants,
// drained by two worker processes of concurrency 8 from an upstream taking 200ms a request: no
// tenant ever has more than 2 requests open at the upstream, and each of them has 2 at times
// (the cap is a cap, not a trickle).
func TestTenantInFlightAcrossWorkers(t *testing.T) {
	c := newCluster(t)
	const name = "tenantcapped"
	oc := newOpenCounter(200 * time.Millisecond)
	c.up.Respond(oc.respond)
	path := c.config(c.queueYAML(name, "200/s", "tenant: header:X-Tenant", "fair: true", "concurrency: 8", "tenant_in_flight: 2"))
	tenants := []string{"a", "b", "c"}
	const n = 90
	c.publishJobs(name, n, func(i int) string { return tenants[i%3] })
	c.spawn(path)
	c.spawn(path)
	c.up.WaitCount(t, 60*time.Second, "every job", func(int) bool { return c.up.Distinct() == n })
	oc.mu.Lock()
	defer oc.mu.Unlock()
	t.Logf("most open at once, by tenant: %v", oc.maxT)
	for _, id := range tenants {
		if m := oc.maxT[id]; m != 2 {
			t.Errorf("tenant %s had at most %d open at once, want 2 (tenant_in_flight)", id, m)
		}
	}
}
