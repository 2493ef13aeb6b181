package main

import (
	"bufio"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// upstreamBin is testdata/upstream, built once per test binary without -race.
var upstreamBin string

// upstream is a no-op upstream in a process of its own (testdata/upstream), for the tests that
// measure the workers' rate: it costs the shared cores a fraction of what the in-process,
// race-instrumented workertest.Recorder does. It answers 200 to everything and reports each
// arrival's instant, job id, attempt and URI. It is safe for concurrent use.
type upstream struct {
	// URL is the base URL of the server, without a trailing slash.
	URL string

	mu       sync.Mutex
	arrivals []workertest.Arrival
	notify   chan struct{}
}

// startUpstream starts an upstream process; the test's cleanup kills it.
func startUpstream(t testing.TB) *upstream {
	t.Helper()
	cmd := exec.Command(upstreamBin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	u := &upstream{notify: make(chan struct{}, 1)}
	lines := bufio.NewScanner(out)
	if !lines.Scan() {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("upstream exited before it listened: %v", lines.Err())
	}
	u.URL = lines.Text()
	go func() {
		defer close(done)
		defer cmd.Wait()
		for lines.Scan() {
			u.add(lines.Text())
		}
	}()
	return u
}

// add records the arrival of one line of the upstream's output.
func (u *upstream) add(line string) {
	f := strings.Fields(line)
	if len(f) != 5 {
		return
	}
	ns, _ := strconv.ParseInt(f[0], 10, 64)
	a := workertest.Arrival{At: time.Unix(0, ns), ID: f[1], URI: f[3]}
	a.Status, _ = strconv.Atoi(f[4])
	a.Attempt, _ = strconv.Atoi(f[2])
	u.mu.Lock()
	u.arrivals = append(u.arrivals, a)
	u.mu.Unlock()
	select {
	case u.notify <- struct{}{}:
	default:
	}
}

// Count returns how many requests arrived.
func (u *upstream) Count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.arrivals)
}

// Arrivals returns the arrivals with request URI uri, in arrival order.
func (u *upstream) Arrivals(uri string) []workertest.Arrival {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []workertest.Arrival
	for _, a := range u.arrivals {
		if a.URI == uri {
			out = append(out, a)
		}
	}
	return out
}

// WaitCount waits until cond holds for the number of arrivals, or fails the test after
// timeout.
func (u *upstream) WaitCount(t testing.TB, timeout time.Duration, what string, cond func(n int) bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for !cond(u.Count()) {
		select {
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s (%d arrivals)", timeout, what, u.Count())
		case <-u.notify:
		}
	}
}
