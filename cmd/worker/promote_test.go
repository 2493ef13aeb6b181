package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/inflight"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// TestMaxInFlightRedisClusterFailover (issue 39): max_in_flight: 5 over 3 worker processes of
// concurrency 8, an upstream taking 300ms a request, on a Redis Cluster of three masters with
// a replica each. The queue's caps are used once (their epoch key reaches the replica), the
// replication link of their master is then stalled (iptables; the test skips unless root)
// while the backlog drains at the cap: the places taken from then on are writes the replica
// never gets, as asynchronous replication loses them. The master is SIGKILLed with 5 requests
// open and its replica takes over at once (CLUSTER FAILOVER TAKEOVER), with the epoch key but
// none of those places. Without the node check of the epoch (inflight/lua/epoch.lua) the
// promoted replica handed the 5 places out again while the 5 requests were still open (6 to
// 10 open at once). Now: never more than 5 open at the upstream; the workers count the loss
// (sluice_place_store_resets_total) and log it, one line each; and the cap is used in full
// again within the queue's timeout (2s) + 3s, plus a second for this shared machine, of the
// promotion.
func TestMaxInFlightRedisClusterFailover(t *testing.T) {
	testenv.NeedBlackHole(t)
	rc := testenv.RedisClusterReplicated(t, time.Second)
	c := newCluster(t)
	c.redisURL = rc.URL()
	const name, limit, took = "promoted", 5, 300 * time.Millisecond
	oc := newOpenCounter(took)
	c.up.Respond(oc.respond)
	path := c.config(c.queueYAML(name, "200/s", "concurrency: 8", fmt.Sprintf("max_in_flight: %d", limit)))
	procs := []*proc{c.spawn(path), c.spawn(path), c.spawn(path)}

	// The caps' first use makes their group's epoch key, which the replica gets.
	workertest.Publish(t, c.qs, name, 10, true)
	c.up.WaitCount(t, 30*time.Second, "the first 10 deliveries", func(k int) bool { return k >= 10 })
	key := "{q:" + name + "}"
	places := inflight.NewRedis(rc.Client)
	testenv.WaitFor(t, 10*time.Second, "every place to be given back", func() bool {
		n, err := places.InFlight(context.Background(), key)
		return err == nil && n[0] == 0
	})
	master, replica := rc.Shard(t, key)
	rc.StallReplication(t, master)

	base := c.up.Count()
	workertest.Publish(t, c.qs, name, 200, true)
	c.up.WaitCount(t, 30*time.Second, "the backlog to drain at the cap", func(k int) bool { return k >= base+20 })
	before := oc.max.Load()
	testenv.WaitFor(t, 5*time.Second, "the cap to be in use", func() bool { return oc.open.Load() == limit })
	open := oc.open.Load()
	master.Stop() // SIGKILL, with the cap's requests open at the upstream
	killed := time.Now()
	rc.Takeover(t, replica, key)
	promoted := time.Now()

	after := c.up.Count()
	c.up.WaitCount(t, 30*time.Second, "15 deliveries after the failover", func(k int) bool { return k >= after+15 })
	var resumed, full time.Time
	as := c.up.Arrivals()
	for i, a := range as {
		if !a.At.After(killed) {
			continue
		}
		if resumed.IsZero() {
			resumed = a.At
		}
		n := 0 // requests open when a arrived: those that arrived less than took before it
		for _, b := range as[:i+1] {
			if a.At.Sub(b.At) < took {
				n++
			}
		}
		if n >= limit && full.IsZero() {
			full = a.At
		}
	}
	var resets []float64
	total := 0.0
	for i, p := range procs {
		v, _ := metricValue(p.metrics(), "sluice_place_store_resets_total")
		resets = append(resets, v)
		total += v
		if n := strings.Count(p.stderr.String(), "Redis lost the concurrency places"); float64(n) != v {
			t.Errorf("worker %d logged the loss %d times and counted it %v times, want one line per loss", i, n, v)
		}
	}
	t.Logf("most open at once: %d before the failover, %d overall (cap %d); %d open at the kill; promoted %v after it; "+
		"deliveries resumed %v and the cap was full again %v after the promotion; resets seen by each worker %v",
		before, oc.max.Load(), limit, open, promoted.Sub(killed).Round(time.Millisecond),
		resumed.Sub(promoted).Round(10*time.Millisecond), full.Sub(promoted).Round(10*time.Millisecond), resets)
	if m := oc.max.Load(); m > limit {
		t.Errorf("%d requests open at the upstream at once, want at most %d", m, limit)
	}
	if full.IsZero() {
		t.Errorf("the cap of %d was not in full use again after the failover", limit)
	} else if d := full.Sub(promoted); d > 2*time.Second+3*time.Second+time.Second {
		t.Errorf("the cap was full again %v after the promotion, want within the timeout (2s) + 3s + 1s", d)
	}
	if total < 1 {
		t.Errorf("no worker counted the failover in sluice_place_store_resets_total (%v)", resets)
	}
}
