package app

import (
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// An ingress whose packets to Redis are dropped (an iptables rule on a second loopback address,
// as root): its /readyz, polled every 25ms, answers within 250ms every time — from checks kept
// in the background, never a call of its own — says 503 within 2.5s of the cut (a check silent
// for 1s counts as failed, and checks run every 0.5s: 1.5s, and a margin for a loaded
// machine), stays 503 while the cut lasts, and 200 again once it ends. Before (issue 39) each /readyz waited on a PING that the black hole held
// for its full timeout.
func TestIngressReadyzWhileRedisIsCut(t *testing.T) {
	testenv.NeedBlackHole(t)
	rs := testenv.RedisWith(t, "--bind", "127.0.0.1", testenv.PartitionAddr)
	ns := testenv.NATS(t)
	up := workertest.NewRecorder(t)
	_, port, _ := net.SplitHostPort(rs.Addr)
	r := start(t, t.TempDir(), fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
upstream: %s
redis: { url: "redis://%s:%s/0" }
nats: { url: %q }
queues:
  - name: orders
    rate: 10/s
    target: POST %s/jobs
rules:
  - name: orders
    match: { methods: [POST], path: /orders }
    action: enqueue
    queue: orders
`, up.URL, testenv.PartitionAddr, port, ns.URL, up.URL))
	waitReadyz(t, r.admin, http.StatusOK, 10*time.Second)

	const bound, turns, hold = 250 * time.Millisecond, 2500 * time.Millisecond, 3 * time.Second
	polls := testenv.PollGet(t, "http://"+r.admin+"/readyz")
	cut, restore := testenv.BlackHole(t, testenv.PartitionAddr, port)
	time.Sleep(hold) // the partition itself: the stimulus
	restored := time.Now()
	restore()
	answers := polls()
	var first503, slowest time.Duration = -1, 0
	n := 0
	for _, p := range answers {
		if p.At.Before(cut) || p.At.After(restored) {
			continue
		}
		n++
		slowest = max(slowest, p.Took)
		if p.Took > bound || p.Err != nil {
			t.Errorf("/readyz at cut+%v: %d after %v (%v), want an answer within %v", p.At.Sub(cut).Round(time.Millisecond), p.Code, p.Took, p.Err, bound)
		}
		if p.Code == http.StatusServiceUnavailable && first503 < 0 {
			first503 = p.At.Add(p.Took).Sub(cut)
		}
		if p.At.Sub(cut) >= turns && p.Code != http.StatusServiceUnavailable {
			t.Errorf("/readyz at cut+%v: %d, want 503 while Redis does not answer", p.At.Sub(cut).Round(time.Millisecond), p.Code)
		}
	}
	t.Logf("Redis cut for %v: %d /readyz answers, slowest %v (bound %v), 503 from cut+%v (bound %v)",
		restored.Sub(cut).Round(time.Millisecond), n, slowest.Round(time.Millisecond), bound, first503.Round(time.Millisecond), turns)
	if first503 < 0 || first503 > turns {
		t.Errorf("/readyz said 503 from cut+%v, want within %v", first503, turns)
	}
	waitReadyz(t, r.admin, http.StatusOK, 10*time.Second)
}
