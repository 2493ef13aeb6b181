package main

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// benchJobs is the backlog each drain benchmark empties, unless -benchtime=Nx asks for more.
const benchJobs = 5000

// BenchmarkDrain compares, against one NATS server in one run, how fast a backlog leaves the
// queue:
//
//   - jetstream: 4 goroutines take jobs through the queue layer (Fetch of 16, Ack each) and
//     do nothing else: the ceiling JetStream sets.
//   - workers-4: 4 worker processes with an unthrottled queue (1,000,000/s, concurrency 16)
//     deliver to a no-op upstream: slot, status writes, HTTP request, ack.
//
// One op is one job: ns/op and jobs/s are measured from the first job taken (delivered) to
// the last, so process start-up is not counted. Run it with
//
//	go test -run '^$' -bench Drain -benchtime 1x ./cmd/worker/
func BenchmarkDrain(b *testing.B) {
	b.Run("jetstream", func(b *testing.B) {
		c := newCluster(b)
		n := max(b.N, benchJobs)
		c.config(c.queueYAML("raw", "1000000/s"))
		workertest.Publish(b, c.qs, "raw", n, true)
		b.ResetTimer()
		var taken atomic.Int64
		var first, last atomic.Int64
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cons, err := c.qs.Consumer(c.ctx, "raw")
				if err != nil {
					b.Error(err)
					return
				}
				for taken.Load() < int64(n) {
					msgs, err := cons.Fetch(c.ctx, 16, 200*time.Millisecond)
					if err != nil {
						b.Error(err)
						return
					}
					for _, m := range msgs {
						if err := m.Ack(c.ctx); err != nil {
							b.Error(err)
							return
						}
						now := time.Now().UnixNano()
						first.CompareAndSwap(0, now)
						last.Store(now)
						taken.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		b.StopTimer()
		report(b, n, time.Duration(last.Load()-first.Load()))
	})
	b.Run("workers-4", func(b *testing.B) {
		c := newCluster(b)
		n := max(b.N, benchJobs)
		path := c.config(c.queueYAML("drain", "1000000/s", "concurrency: 16"))
		workertest.Publish(b, c.qs, "drain", n, true)
		release := c.holdPaused("drain")
		var procs []*proc
		for range 4 {
			procs = append(procs, c.spawn(path))
		}
		b.ResetTimer()
		release()
		c.up.WaitCount(b, 2*time.Minute, "the backlog to drain", func(k int) bool { return k >= n })
		b.StopTimer()
		for _, p := range procs {
			p.kill()
		}
		ts := workertest.Times(c.up.Arrivals())
		report(b, n, ts[len(ts)-1].Sub(ts[0]))
	})
}

func report(b *testing.B, n int, span time.Duration) {
	b.ReportMetric(float64(span.Nanoseconds())/float64(n), "ns/op")
	b.ReportMetric(float64(n-1)/span.Seconds(), "jobs/s")
	b.Logf("%d jobs in %v: %.0f jobs/s", n, span.Round(time.Millisecond), float64(n-1)/span.Seconds())
}
