package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/app"
	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
	"github.com/sluice-rl/sluice/queue"
)

// TestSharedStreamsProcesses: worker processes with nats.shared_streams deliver the jobs of a
// shared queue posted before they started and those posted after, each once, at most rate+1
// in any second, beside a queue with a stream of its own.
func TestSharedStreamsProcesses(t *testing.T) {
	const rate = 20
	c := newCluster(t)
	js, err := jetstream.New(testenv.Connect(t, c.nats.URL))
	if err != nil {
		t.Fatal(err)
	}
	if c.qs, err = queue.New(c.ctx, js, queue.Options{SharedStreams: 4}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(c.dir, "sluice.yaml")
	c.writeConfig(path, c.queueYAML("plain", fmt.Sprintf("%d/s", rate))+c.queueYAML("own", "100/s", "max_bytes: 1048576"))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	withShared := strings.Replace(string(b), "nats: { url: ", "nats: { shared_streams: 4, url: ", 1)
	if err := os.WriteFile(path, []byte(withShared), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil || cfg.NATS.SharedStreams != 4 {
		t.Fatalf("config: %v", err)
	}
	if err := c.qs.Provision(c.ctx, app.QueueSpecs(cfg)); err != nil {
		t.Fatal(err)
	}
	if !c.qs.Shared("plain") || c.qs.Shared("own") {
		t.Fatalf("shared: plain %v, own %v", c.qs.Shared("plain"), c.qs.Shared("own"))
	}
	before := workertest.Publish(t, c.qs, "plain", 30, true)
	procs := []*proc{spawn(t, path), spawn(t, path)}
	for _, p := range procs {
		p.waitReady()
	}
	after := workertest.Publish(t, c.qs, "plain", 30, true)
	own := workertest.Publish(t, c.qs, "own", 5, true)
	want := len(before) + len(after) + len(own)
	c.up.WaitCount(t, 20*time.Second, "every job delivered", func(int) bool { return c.up.Distinct() >= want })
	if n := c.up.Count(); n != want {
		t.Errorf("%d deliveries of %d jobs", n, want)
	}
	var ts []time.Time
	for _, a := range c.up.Arrivals() {
		if strings.HasSuffix(a.URI, "/q/plain") {
			ts = append(ts, a.At)
		}
	}
	ts = workertest.Times(arrivalsAt(ts))
	if w := workertest.MaxWindow(ts, time.Second); w > rate+1 {
		t.Errorf("a 1s window holds %d of plain's deliveries at %d/s", w, rate)
	}
	testenv.WaitFor(t, 5*time.Second, "plain's depth to be 0 once its jobs are acked", func() bool {
		in, err := c.qs.Info(c.ctx, "plain")
		return err == nil && in.Depth == 0
	})
}

// BenchmarkDrainShared compares the unthrottled drain of a backlog by 4 worker processes
// (concurrency 16) from a queue with a stream of its own and from a queue of a shared stream,
// whose every job also rings each worker's doorbell, alternately against one NATS server, 2
// rounds each. Run it with
//
//	go test -run '^$' -bench DrainShared -benchtime 1x ./cmd/worker/
func BenchmarkDrainShared(b *testing.B) {
	c := newCluster(b)
	js, err := jetstream.New(testenv.Connect(b, c.nats.URL))
	if err != nil {
		b.Fatal(err)
	}
	if c.qs, err = queue.New(c.ctx, js, queue.Options{SharedStreams: 4}); err != nil {
		b.Fatal(err)
	}
	n := max(b.N, benchJobs)
	rates := map[string][]float64{}
	for round := 1; round <= 2; round++ {
		for _, kind := range []string{"own", "shared"} {
			name := fmt.Sprintf("%s%d", kind, round)
			extra := []string{"concurrency: 16"}
			if kind == "own" {
				extra = append(extra, "max_bytes: 268435456") // keeps a stream of its own
			}
			path := filepath.Join(c.dir, name+".yaml")
			c.writeConfig(path, c.queueYAML(name, "1000000/s", extra...))
			raw, err := os.ReadFile(path)
			if err != nil {
				b.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(strings.Replace(string(raw), "nats: { url: ", "nats: { shared_streams: 4, url: ", 1)), 0o644); err != nil {
				b.Fatal(err)
			}
			cfg, err := config.Load(path)
			if err != nil {
				b.Fatal(err)
			}
			if err := c.qs.Provision(c.ctx, app.QueueSpecs(cfg)); err != nil {
				b.Fatal(err)
			}
			if c.qs.Shared(name) != (kind == "shared") {
				b.Fatalf("queue %s: shared %v", name, c.qs.Shared(name))
			}
			base := c.up.Count()
			workertest.Publish(b, c.qs, name, n, true)
			release := c.holdPaused(name)
			var procs []*proc
			for range 4 {
				p := spawn(b, path)
				p.waitReady()
				procs = append(procs, p)
			}
			release()
			c.up.WaitCount(b, 2*time.Minute, "the backlog to drain", func(k int) bool { return k-base >= n })
			for _, p := range procs {
				p.kill()
			}
			var ts []time.Time
			for _, a := range c.up.Arrivals() {
				if strings.HasSuffix(a.URI, "/q/"+name) {
					ts = append(ts, a.At)
				}
			}
			r := workertest.Rate(workertest.Times(arrivalsAt(ts)))
			rates[kind] = append(rates[kind], r)
			b.Logf("%-6s round %d: %.0f jobs/s", kind, round, r)
		}
	}
	mean := func(v []float64) float64 { return (v[0] + v[1]) / 2 }
	b.ReportMetric(mean(rates["own"]), "own-jobs/s")
	b.ReportMetric(mean(rates["shared"]), "shared-jobs/s")
	b.Logf("shared / own: %.2f", mean(rates["shared"])/mean(rates["own"]))
}

// arrivalsAt wraps instants as arrivals, for workertest.Times to sort.
func arrivalsAt(ts []time.Time) []workertest.Arrival {
	out := make([]workertest.Arrival, len(ts))
	for i, t := range ts {
		out[i].At = t
	}
	return out
}
