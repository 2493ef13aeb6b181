package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/app"
	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// TestJetStreamFailoverLosesNothing: on a real three-node JetStream cluster with
// nats.replicas: 3, the leader of the queue's stream (a shared one, the default) is killed while jobs are being published and
// drained by two worker processes; every job whose publish was acknowledged is delivered at the
// upstream.
func TestJetStreamFailoverLosesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := testenv.NATSCluster(t)
	rs := testenv.Redis(t)
	up := startUpstream(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "sluice.yaml")
	yaml := fmt.Sprintf(`admin_listen: 127.0.0.1:1
redis: { url: %q }
nats: { url: %q, replicas: 3 }
shutdown_timeout: 5s
queues:
  - name: failover
    rate: 200/s
    concurrency: 16
    target: POST %s/q/failover
    backoff: { initial: 100ms, max: 1s }
    timeout: 2s
    ack_wait: %s
`, rs.URL(), ns.URL, up.URL, ackWait)
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	nc := testenv.Connect(t, ns.URL)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	qs, err := queue.New(ctx, js, app.QueueOptions(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		qs.Close(cctx)
	})
	if err := qs.Provision(ctx, app.QueueSpecs(cfg)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		p := spawn(t, path)
		p.waitReady()
	}

	var (
		mu        sync.Mutex
		acked     []string
		failed    atomic.Int64
		stop      atomic.Bool
		wg        sync.WaitGroup
		published atomic.Int64
	)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
				r, err := qs.Publish(pctx, &queue.Job{Queue: "failover", Direct: true, Body: []byte(fmt.Sprintf("g%d-%d", g, i))})
				pcancel()
				published.Add(1)
				if err != nil {
					failed.Add(1)
					continue
				}
				mu.Lock()
				acked = append(acked, r.ID)
				mu.Unlock()
				time.Sleep(10 * time.Millisecond) // pace the publishers near the drain rate
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
	testenv.WaitFor(t, time.Minute, "jobs published and draining", func() bool { return count() >= 300 && up.Count() >= 100 })
	// The queue is a plain one: its jobs are in a shared stream (nats.shared_streams default).
	stream := fmt.Sprintf("SLUICE_J_%d", sharedSlot("failover", config.DefaultSharedStreams))
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	if r := st.CachedInfo().Config.Replicas; r != 3 {
		t.Fatalf("the queue's stream has %d replicas, want 3", r)
	}
	leader := ns.StreamLeader(t, nc, stream)
	killedAt := time.Now()
	leader.Kill()
	before := count()
	testenv.WaitFor(t, time.Minute, "publishing to go on after the failover", func() bool { return count() >= before+300 })
	failoverTook := time.Since(killedAt)
	stop.Store(true)
	wg.Wait()
	leader.Start()

	mu.Lock()
	want := append([]string(nil), acked...)
	mu.Unlock()
	testenv.WaitFor(t, 2*time.Minute, "every acknowledged job delivered", func() bool {
		seen := map[string]bool{}
		for _, a := range up.Arrivals("/q/failover") {
			seen[a.ID] = true
		}
		for _, id := range want {
			if !seen[id] {
				return false
			}
		}
		return true
	})
	t.Logf("stream leader %s killed; publishing resumed within %v; %d acknowledged, %d failed publishes, %d deliveries, 0 lost",
		leader.Name, failoverTook.Round(100*time.Millisecond), len(want), failed.Load(), len(up.Arrivals("/q/failover")))
}
