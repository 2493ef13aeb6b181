package main

import (
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// TestAdaptiveDrainLearnsTheUpstream: an upstream that takes 20/s behind a 50/s adaptive
// queue drained by 3 worker processes. The workers learn its rate together instead of
// bouncing off its 429s: over the second half of the drain, at least 70% of what the upstream
// takes succeeds (15.5–16.1/s measured) and at most 3% of the deliveries get a 429 (0.6–1.2%).
// Without adaptive (SLUICE_ADAPTIVE_OFF=1) the same drain measured 6.0/s and 12.3% 429s: each
// 429 pauses the queue for its Retry-After and the full rate runs into the next one.
// SLUICE_ADAPTIVE_OFF=1 runs the same drain without adaptive, for comparison.
func TestAdaptiveDrainLearnsTheUpstream(t *testing.T) {
	c := newCluster(t)
	up := startUpstream(t)
	extra := []string{"concurrency: 16", "adaptive: true"}
	if os.Getenv("SLUICE_ADAPTIVE_OFF") == "1" {
		extra = extra[:1]
	}
	path := c.config(c.queueYAMLTo(up.URL+"/limited/20", "adapt", "50/s", extra...))
	const jobs = 500
	workertest.Publish(t, c.qs, "adapt", jobs, true)
	start := time.Now()
	var procs []*proc
	for range 3 {
		procs = append(procs, c.spawn(path))
	}
	defer func() {
		if t.Failed() {
			t.Logf("worker log:\n%s", tail(procs[0].stderr.String(), 40))
		}
	}()
	uri := "/limited/20/q/adapt"
	succeeded := func() int {
		n := 0
		for _, a := range up.Arrivals(uri) {
			if a.Status == http.StatusOK {
				n++
			}
		}
		return n
	}
	// 20 s of the drain: about 400 jobs at the upstream's 20/s.
	up.WaitCount(t, 2*time.Minute, "20 s of drain", func(int) bool { return time.Since(start) > 20*time.Second || succeeded() >= jobs })
	from := start.Add(10 * time.Second)
	var ok, limited int
	var last time.Time
	for _, a := range up.Arrivals(uri) {
		if a.At.Before(from) {
			continue
		}
		last = a.At
		switch a.Status {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
			limited++
		}
	}
	span := last.Sub(from).Seconds()
	if span <= 0 {
		t.Fatal("no deliveries in the second half")
	}
	rate, share := float64(ok)/span, float64(limited)/float64(ok+limited)
	t.Logf("after %v: %.1f succeeded/s (upstream takes 20/s), %.1f%% answered 429 (%d of %d)",
		from.Sub(start), rate, 100*share, limited, ok+limited)
	if os.Getenv("SLUICE_ADAPTIVE_OFF") == "1" {
		return
	}
	if rate < 14 {
		t.Errorf("%.1f succeeded/s, want at least 14 (70%% of the 20/s the upstream takes)", rate)
	}
	if share > 0.03 {
		t.Errorf("%.1f%% of deliveries got a 429, want at most 3%%", 100*share)
	}
}
