package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
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
//   - workers-4-max-in-flight-64 and -32: the same with max_in_flight set: every delivery
//     holds a concurrency place, under a cap the 64 jobs the workers hold never reach (a
//     place serves one delivery after another in its worker, inflight.Reuse), and under one
//     they do (a take and a give-back, two Redis round trips, per delivery).
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
	b.Run("workers-4", func(b *testing.B) { benchWorkers(b) })
	// The same, each delivery holding a concurrency place: max_in_flight 64 (never reached by
	// 4 × 16) shows what the places cost, 32 what a binding cap does to the rate.
	b.Run("workers-4-max-in-flight-64", func(b *testing.B) { benchWorkers(b, "max_in_flight: 64") })
	b.Run("workers-4-max-in-flight-32", func(b *testing.B) { benchWorkers(b, "max_in_flight: 32") })
}

// benchWorkers drains a backlog with 4 worker processes of an unthrottled queue with extra keys.
func benchWorkers(b *testing.B, extra ...string) {
	c := newCluster(b)
	n := max(b.N, benchJobs)
	path := c.config(c.queueYAML("drain", "1000000/s", append([]string{"concurrency: 16"}, extra...)...))
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
}

func report(b *testing.B, n int, span time.Duration) {
	b.ReportMetric(float64(span.Nanoseconds())/float64(n), "ns/op")
	b.ReportMetric(float64(n-1)/span.Seconds(), "jobs/s")
	b.Logf("%d jobs in %v: %.0f jobs/s", n, span.Round(time.Millisecond), float64(n-1)/span.Seconds())
}

// baselineBin: see BenchmarkDrainCost.
var baselineBin = flag.String("baseline", "", "another worker `binary` that BenchmarkDrainCost runs alternately with this one")

// BenchmarkDrainCost measures what delivering a job costs 4 worker processes, unthrottled
// (from the moment they are ready, and again 3 s after: a fresh worker's start window), at a
// throttled 2000/s, and unthrottled under a max_in_flight they never reach: the rate they
// reach, the CPU time per delivered job of the workers, nats-server and redis-server, and the
// workers' context switches per job (from /proc, so on Linux only). The upstream is the no-op testdata/upstream process. Each case
// drains 3 backlogs and reports the medians.
//
// With -baseline, another worker binary (built from an earlier commit, say) drains every other
// backlog against the same servers, and the log holds both and their ratios: on a shared
// machine only such interleaved runs compare fairly.
//
//	git archive <commit> | tar -x -C /tmp/old && (cd /tmp/old && go build -o /tmp/worker-old ./cmd/worker)
//	go test -run '^$' -bench DrainCost -benchtime 1x ./cmd/worker/ -args -baseline /tmp/worker-old
//
// CPU per job depends on the machine's load as well as on the code: an idle machine lets every
// process spin and wake for each event, a busy one batches work up. Compare within one run.
func BenchmarkDrainCost(b *testing.B) {
	for _, cs := range []struct {
		name, rate        string
		jobs, concurrency int
		extra             []string
		settle            time.Duration // after the workers are ready, before the drain
	}{
		{"unthrottled", "1000000/s", 5000, 16, nil, 0},
		// The same drain from workers that have run for a while: what a fresh worker's first
		// seconds cost (issue 44 item 5, docs/design/worker-costs.md).
		{"unthrottled-settled", "1000000/s", 5000, 16, nil, 3 * time.Second},
		{"throttled-2000", "2000/s", 8000, 64, nil, 0},
		// Each delivery takes and gives back a concurrency place, under a cap never reached.
		{"max-in-flight-64", "1000000/s", 5000, 16, []string{"max_in_flight: 64"}, 0},
	} {
		b.Run(cs.name, func(b *testing.B) {
			c := newCluster(b)
			up := startUpstream(b)
			type variant struct{ name, bin string }
			variants := []variant{{"this", workerBin}}
			if *baselineBin != "" {
				variants = append(variants, variant{"baseline", *baselineBin})
			}
			natsPID, redisPID := childPID("nats-server"), childPID("redis-server")
			n := max(b.N, cs.jobs)
			results := map[string][]drainCost{}
			queue := 0
			for round := 1; round <= 3; round++ {
				for _, v := range variants {
					queue++
					name := fmt.Sprintf("cost%d", queue)
					path := c.config(c.queueYAMLTo(up.URL, name, cs.rate, append([]string{fmt.Sprintf("concurrency: %d", cs.concurrency)}, cs.extra...)...))
					base := up.Count()
					workertest.Publish(b, c.qs, name, n, true)
					release := c.holdPaused(name)
					var procs []*proc
					for range 4 {
						p := spawnBin(b, v.bin, path)
						p.waitReady()
						procs = append(procs, p)
					}
					cpu := func() (workers, nats, redis time.Duration) {
						for _, p := range procs {
							workers += cpuTime(p.cmd.Process.Pid)
						}
						return workers, cpuTime(natsPID), cpuTime(redisPID)
					}
					switches := func() (n int64) {
						for _, p := range procs {
							n += contextSwitches(p.cmd.Process.Pid)
						}
						return n
					}
					if cs.settle > 0 {
						time.Sleep(cs.settle) // the condition measured, not a wait for one
					}
					w0, n0, r0 := cpu()
					s0 := switches()
					release()
					up.WaitCount(b, 2*time.Minute, "the backlog to drain", func(k int) bool { return k-base >= n })
					w1, n1, r1 := cpu()
					s1 := switches()
					for _, p := range procs {
						p.kill()
					}
					per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
					r := drainCost{workertest.Rate(workertest.Times(up.Arrivals("/q/" + name))), per(w1 - w0), per(n1 - n0), per(r1 - r0)}
					results[v.name] = append(results[v.name], r)
					b.Logf("%-8s round %d: %7.0f jobs/s, CPU µs/job: workers %4.0f, nats-server %4.0f, redis-server %3.0f; workers' context switches per job %.2f",
						v.name, round, r.rate, r.workers, r.nats, r.redis, float64(s1-s0)/float64(n))
				}
			}
			this := medianCost(results["this"])
			b.ReportMetric(this.rate, "jobs/s")
			b.ReportMetric(this.workers, "worker-µs/job")
			b.ReportMetric(this.nats, "nats-µs/job")
			b.ReportMetric(this.redis, "redis-µs/job")
			b.ReportMetric(1e9/this.rate, "ns/op")
			if base, ok := results["baseline"]; ok {
				bl := medianCost(base)
				b.Logf("medians, this / baseline: %.0f / %.0f jobs/s (×%.2f); CPU µs/job: workers %.0f / %.0f (×%.2f), nats-server %.0f / %.0f (×%.2f), redis-server %.0f / %.0f (×%.2f)",
					this.rate, bl.rate, this.rate/bl.rate, this.workers, bl.workers, this.workers/bl.workers,
					this.nats, bl.nats, this.nats/bl.nats, this.redis, bl.redis, this.redis/bl.redis)
			}
		})
	}
}

// drainCost is one drain's rate and CPU time per job, µs.
type drainCost struct{ rate, workers, nats, redis float64 }

// medianCost returns the median of each field of cs.
func medianCost(cs []drainCost) drainCost {
	med := func(f func(drainCost) float64) float64 {
		xs := make([]float64, len(cs))
		for i, c := range cs {
			xs[i] = f(c)
		}
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	return drainCost{
		rate:    med(func(c drainCost) float64 { return c.rate }),
		workers: med(func(c drainCost) float64 { return c.workers }),
		nats:    med(func(c drainCost) float64 { return c.nats }),
		redis:   med(func(c drainCost) float64 { return c.redis }),
	}
}

// clockTick is the unit of /proc's CPU times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// cpuTime returns the user and system CPU time process pid has used, from /proc/<pid>/stat;
// 0 when it cannot be read.
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name, which is in parentheses and may hold spaces:
	// state ppid ... utime (14th field of the line) stime (15th).
	_, rest, ok := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * clockTick
}

// contextSwitches returns the context switches, voluntary and not, of every thread of process
// pid so far, from /proc/<pid>/task/*/status: about one per time a thread went to sleep and
// woke, which is what a throttled drain pays per job that an unthrottled one does not.
func contextSwitches(pid int) (n int64) {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.HasSuffix(k, "ctxt_switches") {
				c, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				n += c
			}
		}
	}
	return n
}

// childPID returns the pid of a child process of this one whose command name is comm, or 0.
func childPID(comm string) int {
	if pids := childPIDs(comm); len(pids) > 0 {
		return pids[0]
	}
	return 0
}

// childPIDs returns the pids of the child processes of this one whose command name is comm.
func childPIDs(comm string) []int {
	var pids []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(d + "/stat")
		if err != nil {
			continue
		}
		name, rest, ok := strings.Cut(string(b), ") ")
		f := strings.Fields(rest)
		if !ok || len(f) < 2 || !strings.HasSuffix(name, "("+comm) {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == os.Getpid() {
			pid, _ := strconv.Atoi(filepath.Base(d))
			pids = append(pids, pid)
		}
	}
	return pids
}
