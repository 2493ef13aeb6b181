package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/app"
	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// BenchmarkIdleQueues is the cost of many idle queues in distributed mode: redis-server,
// nats-server, one ingress and workers as processes. For each shape it reports how long the
// ingress and then each worker take to be ready (the ingress creates the streams; then again
// once they exist), the CPU nats-server and the busiest worker use over 10 s while every queue
// is idle, and how soon a job published to an idle queue picked at random reaches the
// upstream (p50, p99 of 100). With -baseline (a worker binary) and -baseline-ingress, each
// shape runs the baseline too, in the same run, each on a fresh nats-server.
//
//	go test -run '^$' -bench IdleQueues -benchtime 1x ./cmd/worker/
func BenchmarkIdleQueues(b *testing.B) {
	ingressBin := filepath.Join(b.TempDir(), "ingress")
	if out, err := exec.Command("go", "build", "-o", ingressBin, "../ingress").CombinedOutput(); err != nil {
		b.Fatalf("go build ../ingress: %v\n%s", err, out)
	}
	type variant struct{ name, worker, ingress string }
	variants := []variant{{"this", workerBin, ingressBin}}
	if *baselineBin != "" && *baselineIngress != "" {
		variants = append(variants, variant{"baseline", *baselineBin, *baselineIngress})
	}
	for _, cs := range []struct{ queues, workers int }{{100, 2}, {100, 4}, {1000, 2}, {1000, 4}} {
		b.Run(fmt.Sprintf("queues-%d-workers-%d", cs.queues, cs.workers), func(b *testing.B) {
			for _, v := range variants {
				m := measureIdle(b, v.worker, v.ingress, cs.queues, cs.workers)
				if v.name == "this" {
					b.ReportMetric(m.natsPct, "nats-cpu-%")
					b.ReportMetric(m.workerPct, "worker-cpu-%")
					b.ReportMetric(m.ingressReady.Seconds(), "ingress-ready-s")
					b.ReportMetric(m.ingressAgain.Seconds(), "ingress-restart-s")
					b.ReportMetric(m.workerReady.Seconds(), "worker-ready-s")
					b.ReportMetric(float64(m.p99.Microseconds())/1000, "wake-p99-ms")
				}
				b.Logf("%-8s %4d queues × %d workers: nats-server %5.1f%% of a core, busiest worker %5.1f%%, ingress ready in %v (%v once the streams exist), slowest worker in %v; an idle queue's job at the upstream in %v (p50), %v (p99)",
					v.name, cs.queues, cs.workers, m.natsPct, m.workerPct, m.ingressReady.Round(10*time.Millisecond),
					m.ingressAgain.Round(10*time.Millisecond), m.workerReady.Round(10*time.Millisecond),
					m.p50.Round(100*time.Microsecond), m.p99.Round(100*time.Microsecond))
			}
		})
	}
}

var baselineIngress = flag.String("baseline-ingress", "", "another ingress `binary` that BenchmarkIdleQueues runs beside this one (with -baseline)")

// idleCost is what one run of BenchmarkIdleQueues measured.
type idleCost struct {
	natsPct, workerPct                      float64
	ingressReady, ingressAgain, workerReady time.Duration
	p50, p99                                time.Duration
}

// measureIdle runs queues idle queues with workers worker processes of workerBin and one
// ingress of ingressBin on a fresh cluster, and measures them.
func measureIdle(b *testing.B, workerBin, ingressBin string, queues, workers int) (m idleCost) {
	before := childPIDs("nats-server")
	c := newCluster(b)
	var natsPID int
	for _, pid := range childPIDs("nats-server") {
		if !slices.Contains(before, pid) {
			natsPID = pid // this cluster's, not an earlier one's still running
		}
	}
	var y strings.Builder
	names := make([]string, queues)
	for i := range names {
		names[i] = fmt.Sprintf("idle%04d", i)
		y.WriteString(c.queueYAML(names[i], "100/s", "max_bytes: 1048576")) // reserved on the store: 1 GiB for 1 000 (without it nothing is reserved)
	}
	path := filepath.Join(c.dir, "sluice.yaml")
	c.writeConfig(path, y.String())

	start := time.Now()
	ing := spawnIngress(b, ingressBin, path)
	readyWithin(b, ing, 2*time.Minute)
	m.ingressReady = time.Since(start)
	// Again, with the streams there: what every start after the first costs.
	ing.kill()
	start = time.Now()
	ing = spawnIngress(b, ingressBin, path)
	readyWithin(b, ing, 2*time.Minute)
	m.ingressAgain = time.Since(start)
	var procs []*proc
	for range workers {
		start := time.Now()
		p := spawnBin(b, workerBin, path)
		readyWithin(b, p, 2*time.Minute)
		m.workerReady = max(m.workerReady, time.Since(start))
		procs = append(procs, p)
	}
	// The test's own queue layer learns the queues (they exist: nothing is created).
	cfg, err := config.Load(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := c.qs.Provision(c.ctx, app.QueueSpecs(cfg)); err != nil {
		b.Fatal(err)
	}

	// Idle: let start-up settle, then measure 10 s.
	time.Sleep(2 * time.Second)
	cpu := func() (workers []time.Duration, nats time.Duration) {
		for _, p := range procs {
			workers = append(workers, cpuTime(p.cmd.Process.Pid))
		}
		return workers, cpuTime(natsPID)
	}
	const window = 10 * time.Second
	w0, n0 := cpu()
	time.Sleep(window)
	w1, n1 := cpu()
	for i := range w0 {
		m.workerPct = max(m.workerPct, 100*float64(w1[i]-w0[i])/float64(window))
	}
	m.natsPct = 100 * float64(n1-n0) / float64(window)

	// Wake: one job at a time to a random idle queue.
	var lat []time.Duration
	for range 100 {
		base := c.up.Count()
		name := names[rand.IntN(len(names))]
		sent := time.Now()
		ctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
		_, err := c.qs.Publish(ctx, &queue.Job{Queue: name, Method: "POST", Path: "/" + name})
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		c.up.WaitCount(b, 10*time.Second, "the job at the upstream", func(n int) bool { return n > base })
		arr := c.up.Arrivals()
		lat = append(lat, arr[len(arr)-1].At.Sub(sent))
	}
	slices.Sort(lat)
	m.p50, m.p99 = lat[len(lat)/2], lat[len(lat)*99/100]
	for _, p := range procs {
		p.kill()
	}
	ing.kill()
	return m
}

// spawnIngress starts an ingress process of bin on path with its listeners on free ports.
func spawnIngress(t testing.TB, bin, path string) *proc {
	t.Helper()
	p := &proc{t: t, admin: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, "-config", path)
	p.cmd.Env = append(os.Environ(), "SLUICE_ADMIN_LISTEN="+p.admin, fmt.Sprintf("SLUICE_LISTEN=127.0.0.1:%d", testenv.FreePort(t)))
	p.cmd.Stderr = p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(p.kill)
	return p
}

// readyWithin waits until p's /readyz answers 200, for at most d.
func readyWithin(t testing.TB, p *proc, d time.Duration) {
	t.Helper()
	testenv.WaitFor(t, d, p.admin+" to be ready", func() bool {
		select {
		case <-p.done:
			t.Fatalf("exited during start-up: %v\n%s", p.err, tail(p.stderr.String(), 2000))
		default:
		}
		resp, err := http.Get("http://" + p.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}
