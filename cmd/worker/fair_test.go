package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/worker/workertest"
	"github.com/sluice-rl/sluice/queue"
)

// publishTenant publishes n direct jobs of the tenant whose X-Tenant header is value, as the
// ingress would (its tenant is the queues' TenantID of the value), and returns their ids.
func (c *cluster) publishTenant(name, value string, n int) []string {
	c.t.Helper()
	return c.publishJobs(name, n, func(int) string { return value })
}

// publishJobs publishes n direct jobs of queue name, 8 at a time, job i belonging to the tenant
// whose X-Tenant value is tenant(i), and returns their ids by i.
func (c *cluster) publishJobs(name string, n int, tenant func(i int) string) []string {
	c.t.Helper()
	ids := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 8)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
			defer cancel()
			value := tenant(i)
			r, err := c.qs.Publish(ctx, &queue.Job{Queue: name, Direct: true, Tenant: c.qs.TenantID([]byte(value)),
				Header: http.Header{"Content-Type": {"text/plain"}}, Body: fmt.Appendf(nil, "%s-%d", value, i)})
			if err != nil {
				errs <- err
				return
			}
			ids[i] = r.ID
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		c.t.Fatal(err)
	}
	return ids
}

// fairYAML is a fair queue at rate, tenants by X-Tenant, with extra keys.
func (c *cluster) fairYAML(up *upstream, name, rate string, extra ...string) string {
	return c.queueYAMLTo(up.URL, name, rate, append([]string{"tenant: header:X-Tenant", "fair: true", "concurrency: 8"}, extra...)...)
}

// idsOf is the set of ids.
func idsOf(ids []string) map[string]bool {
	m := make(map[string]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}

// TestFairShareAcrossWorkers: on a fair queue at 20/s drained by 2 worker processes, a tenant
// that submits 10 jobs behind another tenant's 300-job backlog has all 10 delivered within 3s
// (in arrival order it would wait 15s), and the upstream sees the queue's rate: at most
// rate + 1 in any second, within 1% over the run.
func TestFairShareAcrossWorkers(t *testing.T) {
	c := newCluster(t)
	up := startUpstream(t)
	const name, rate = "fairshare", 20
	path := c.config(c.fairYAML(up, name, fmt.Sprintf("%d/s", rate)))
	big := idsOf(c.publishTenant(name, "big", 300))
	// The workers start with the schedule paused, so that no process starts beside the
	// measured drain (as in TestAccuracy).
	release := c.holdPaused(name)
	for range 2 {
		c.spawn(path).waitReady()
	}
	release()
	up.WaitCount(t, time.Minute, "the big backlog to drain for a while", func(n int) bool { return n >= 40 })
	sent := time.Now()
	small := idsOf(c.publishTenant(name, "small", 10))
	var last time.Time
	up.WaitCount(t, 30*time.Second, "the small tenant's jobs", func(int) bool {
		got := 0
		for _, a := range up.Arrivals("/q/" + name) {
			if small[a.ID] {
				got++
				last = a.At
			}
		}
		return got >= 10
	})
	took := last.Sub(sent)
	t.Logf("10 jobs behind a 300-job backlog at %d/s: all delivered %v after they were accepted (FIFO: %v)",
		rate, took.Round(10*time.Millisecond), time.Duration(300-40)*time.Second/rate)
	if last.IsZero() || took > 3*time.Second {
		t.Errorf("the small tenant's 10 jobs took %v (or never all came), want <= 3s", took)
	}
	up.WaitCount(t, time.Minute, "the backlog to drain", func(n int) bool { return n >= 310 })
	as := up.Arrivals("/q/" + name)
	seen := map[string]bool{}
	for _, a := range as {
		if !big[a.ID] && !small[a.ID] {
			t.Fatalf("unknown job %s delivered", a.ID)
		}
		seen[a.ID] = true
	}
	if len(seen) != 310 {
		t.Fatalf("%d distinct jobs delivered, want 310", len(seen))
	}
	checkRate(t, workertest.Times(as), rate)
}

// checkRate asserts the upstream saw ts at rate: at most rate + 1 in any second, and within 1%
// of rate over the run.
func checkRate(t *testing.T, ts []time.Time, rate int) {
	t.Helper()
	window, got := workertest.MaxWindow(ts, time.Second), workertest.Rate(ts)
	t.Logf("%d deliveries: %.2f/s, at most %d in any second", len(ts), got, window)
	if window > rate+1 {
		t.Errorf("a one-second window held %d deliveries, want <= %d", window, rate+1)
	}
	if got > float64(rate)*1.01 || got < float64(rate)*0.99 {
		t.Errorf("drained at %.2f/s, want %d/s ±1%%", got, rate)
	}
}

// TestFairWeightsAcrossWorkers: with weights gold 3 and plain 1, while both have jobs waiting,
// gold gets 3× plain's deliveries ±20%, through 2 worker processes; killing one of them with
// SIGKILL mid-drain (the scheduler's leader, or not) loses no job.
func TestFairWeightsAcrossWorkers(t *testing.T) {
	c := newCluster(t)
	up := startUpstream(t)
	const name, rate = "fairweights", 40
	path := c.config(c.fairYAML(up, name, fmt.Sprintf("%d/s", rate), "weights: { gold: 3 }"))
	gold := idsOf(c.publishTenant(name, "gold", 300))
	plain := idsOf(c.publishTenant(name, "plain", 300))
	var procs []*proc
	release := c.holdPaused(name)
	for range 3 {
		p := c.spawn(path)
		p.waitReady()
		procs = append(procs, p)
	}
	release()
	up.WaitCount(t, time.Minute, "200 deliveries", func(n int) bool { return n >= 200 })
	// Kill the first worker (the likeliest leader: it started first) without a chance to hand
	// anything back or give up its lease.
	if err := procs[0].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	as := up.Arrivals("/q/" + name)[:200]
	counts := map[string]int{}
	for _, a := range as {
		switch {
		case gold[a.ID]:
			counts["gold"]++
		case plain[a.ID]:
			counts["plain"]++
		}
	}
	ratio := float64(counts["gold"]) / float64(counts["plain"])
	t.Logf("first 200 deliveries: gold %d, plain %d: %.2f×", counts["gold"], counts["plain"], ratio)
	if ratio < 2.4 || ratio > 3.6 {
		t.Errorf("gold got %.2f× plain's deliveries, want 3× ±20%%", ratio)
	}
	checkRate(t, workertest.Times(as), rate)

	up.WaitCount(t, 2*time.Minute, "every job after the kill", func(int) bool {
		seen := map[string]bool{}
		for _, a := range up.Arrivals("/q/" + name) {
			seen[a.ID] = true
		}
		return len(seen) >= 600
	})
	seen := map[string]bool{}
	for _, a := range up.Arrivals("/q/" + name) {
		if !gold[a.ID] && !plain[a.ID] {
			t.Fatalf("unknown job %s delivered", a.ID)
		}
		seen[a.ID] = true
	}
	if len(seen) != 600 {
		t.Fatalf("%d distinct jobs delivered, want 600", len(seen))
	}
}

// TestFairTenantRate: tenant_rate caps a tenant, even alone, and it gets close to its cap.
func TestFairTenantRate(t *testing.T) {
	c := newCluster(t)
	up := startUpstream(t)
	const name = "faircap"
	path := c.config(c.fairYAML(up, name, "40/s", "tenant_rate: 5/s"))
	alone := idsOf(c.publishTenant(name, "alone", 30))
	c.spawn(path)
	c.spawn(path)
	up.WaitCount(t, time.Minute, "the capped tenant's jobs", func(n int) bool { return n >= 30 })
	ts := workertest.Times(up.Arrivals("/q/" + name))
	if len(ts) != len(alone) {
		t.Fatalf("%d deliveries, want %d", len(ts), len(alone))
	}
	window, got := workertest.MaxWindow(ts, time.Second), workertest.Rate(ts)
	t.Logf("one tenant capped at 5/s on a 40/s queue: %.2f/s, at most %d in any second", got, window)
	if window > 6 || got > 5.05 || got < 4.75 {
		t.Errorf("the tenant got %.2f/s and %d in one second, want 4.75-5/s and <= 6", got, window)
	}
}

// BenchmarkFairDrain compares, in one run, how fast 4 worker processes drain the same
// backlog of 10 000 jobs (unthrottled: 1,000,000/s, concurrency 16, a no-op upstream) from a
// FIFO queue and from a fair queue whose jobs belong to 1, 100 or 10 000 tenants, spread
// evenly. One op is one job, timed from the first delivery to the last. Run it with
//
//	go test -run '^$' -bench FairDrain -benchtime 1x ./cmd/worker/
func BenchmarkFairDrain(b *testing.B) {
	const jobs = 10_000
	for _, tenants := range []int{0, 1, 100, 10_000} {
		name := "fifo"
		if tenants > 0 {
			name = fmt.Sprintf("fair-%d", tenants)
		}
		b.Run(name, func(b *testing.B) {
			c := newCluster(b)
			queueName := strings.ReplaceAll(name, "-", "")
			extra := []string{"concurrency: 16", "tenant: header:X-Tenant"}
			if tenants > 0 {
				extra = append(extra, "fair: true")
			}
			path := c.config(c.queueYAML(queueName, "1000000/s", extra...))
			c.publishJobs(queueName, jobs, func(i int) string { return fmt.Sprintf("t%d", i%max(tenants, 1)) })
			release := c.holdPaused(queueName)
			var procs []*proc
			for range 4 {
				p := c.spawn(path)
				p.waitReady()
				procs = append(procs, p)
			}
			b.ResetTimer()
			release()
			c.up.WaitCount(b, 3*time.Minute, "the backlog to drain", func(k int) bool { return k >= jobs })
			b.StopTimer()
			for _, p := range procs {
				p.kill()
			}
			ts := workertest.Times(c.up.Arrivals())
			report(b, jobs, ts[len(ts)-1].Sub(ts[0]))
		})
	}
}
