package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// BenchmarkFairManyTenants measures the drain of a fair queue whose 10 000 jobs belong to 10 000
// tenants (one job each) against the same queue's drain with one tenant, in rounds of the two
// side by side against the same servers, so that the machine's load weighs on both alike: 4
// worker processes (unthrottled: 1,000,000/s, concurrency 16) deliver a backlog published
// before they start to the no-op upstream process, timed from the first delivery to the last.
// Each drain logs its rate and the CPU time per job of the workers and nats-server (from
// /proc, Linux only); each round the ratio of its two rates. The figure is the median ratio
// (ratio-10k/1). With -baseline, another worker binary drains too, every round, and the log
// holds its ratios beside (see BenchmarkDrainCost for how to build one). One round per b.N
// (with -benchtime Nx the testing package runs one round, then N):
//
//	go test -run '^$' -bench FairManyTenants -benchtime 3x ./cmd/worker/ [-args -baseline BIN]
func BenchmarkFairManyTenants(b *testing.B) {
	const jobs = 10_000
	c := newCluster(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	c.ctx = ctx // the cluster's 3 minutes are too few for the rounds
	up := startUpstream(b)
	type variant struct{ name, bin string }
	variants := []variant{{"this", workerBin}}
	if *baselineBin != "" {
		variants = append(variants, variant{"baseline", *baselineBin})
	}
	natsPID := childPID("nats-server")
	ratios := map[string][]float64{}
	queue := 0
	js, err := jetstream.New(testenv.Connect(b, c.nats.URL))
	if err != nil {
		b.Fatal(err)
	}
	drain := func(v variant, tenants int) drainCost {
		bin := v.bin
		queue++
		name := fmt.Sprintf("fair%d", queue)
		path := c.config(c.queueYAMLTo(up.URL, name, "1000000/s", "concurrency: 16", "tenant: header:X-Tenant", "fair: true"))
		base := up.Count()
		c.publishJobs(name, jobs, func(i int) string { return fmt.Sprintf("t%d", i%tenants) })
		if v.name == "baseline" {
			// A baseline from before the backlog's hold consumer runs on the layout it made:
			// with a hold, its subject purges would walk the hold's pending jobs.
			l, err := c.qs.FairLayout(name)
			if err == nil {
				err = js.DeleteConsumer(c.ctx, l.Backlog, l.Hold)
			}
			if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				b.Fatal(err)
			}
		}
		release := c.holdPaused(name)
		var procs []*proc
		for range 4 {
			p := spawnBin(b, bin, path)
			p.waitReady()
			procs = append(procs, p)
		}
		cpu := func() (workers, nats time.Duration) {
			for _, p := range procs {
				workers += cpuTime(p.cmd.Process.Pid)
			}
			return workers, cpuTime(natsPID)
		}
		w0, n0 := cpu()
		release()
		up.WaitCount(b, 3*time.Minute, "the backlog to drain", func(k int) bool { return k-base >= jobs })
		w1, n1 := cpu()
		for _, p := range procs {
			p.kill()
		}
		per := func(d time.Duration) float64 { return float64(d.Microseconds()) / jobs }
		return drainCost{rate: workertest.Rate(workertest.Times(up.Arrivals("/q/" + name))), workers: per(w1 - w0), nats: per(n1 - n0)}
	}
	b.ResetTimer()
	for round := 1; round <= b.N; round++ {
		for _, v := range variants {
			one, many := drain(v, 1), drain(v, jobs)
			ratios[v.name] = append(ratios[v.name], many.rate/one.rate)
			b.Logf("%-8s round %d: 1 tenant %5.0f jobs/s (CPU µs/job: workers %3.0f, nats-server %3.0f); 10 000 tenants %5.0f jobs/s (workers %3.0f, nats-server %3.0f); ratio %.2f",
				v.name, round, one.rate, one.workers, one.nats, many.rate, many.workers, many.nats, many.rate/one.rate)
		}
	}
	b.StopTimer()
	b.ReportMetric(median(ratios["this"]), "ratio-10k/1")
	if bl, ok := ratios["baseline"]; ok {
		b.Logf("median ratios: this %.2f %v, baseline %.2f %v", median(ratios["this"]), ratios["this"], median(bl), bl)
	}
}

// median is the median of xs (the mean of the middle two when even); 0 when empty.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
