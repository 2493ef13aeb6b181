package main

import (
	"bytes"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/worker/workertest"
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
