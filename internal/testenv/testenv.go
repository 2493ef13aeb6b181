// Package testenv starts the real servers Sluice's tests talk to: redis-server (from the system,
// installed by `make test`; also as a small Redis Cluster) and NATS with JetStream (the
// nats-server/v2 module, embedded or built and run as a separate process), and a headless
// browser (chromedp) for the dashboard's tests; and "regions" as a NATS supercluster, a
// one-server cluster per region joined by gateways through in-process Toxiproxy links that add
// latency and can be cut ([NewSupercluster]). Each server listens on a free loopback port,
// keeps its data in a temporary directory, and is stopped by t.Cleanup. It also reads
// Prometheus metrics from a registry for assertions, and measures the time the machine took
// from the process ([Lag], [Runnable]), so that a timing test that missed can show it was
// starved before it tries again.
//
// Tests isolate themselves by key prefix ([Prefix]) and stream name ([Name]), so packages run in
// parallel against one machine.
//
// Strict mode: when SLUICE_STRICT=1 (set by `make test` and CI) a test whose server cannot be
// started fails. Otherwise it is skipped with a message saying how to run it.
package testenv

import (
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// Strict reports whether tests must fail, rather than skip, when a server cannot be started.
func Strict() bool { return os.Getenv("SLUICE_STRICT") == "1" }

// unavailable fails the test in strict mode and skips it otherwise.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if Strict() {
		t.Fatalf("testenv: %s (SLUICE_STRICT=1)", msg)
	}
	t.Skipf("testenv: %s; run `make test` to install what is missing and run every test", msg)
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

var seq atomic.Int64

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// Name returns a name unique to this test run, made of letters, digits, '-' and '_', usable as a
// stream, queue or consumer name. It is at most 48 bytes long.
func Name(t testing.TB) string {
	base := unsafeChars.ReplaceAllString(t.Name(), "_")
	if len(base) > 32 {
		base = base[len(base)-32:]
	}
	return fmt.Sprintf("%s_%d_%d", base, os.Getpid()%100000, seq.Add(1))
}

// Prefix returns a Redis key prefix unique to this test, ending in ':'.
func Prefix(t testing.TB) string { return "t:" + Name(t) + ":" }

// WaitFor polls cond every few milliseconds until it returns true or timeout passes, then fails
// the test with msg. It is how tests wait for a condition instead of sleeping.
func WaitFor(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: timed out after %v waiting for %s", timeout, msg)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
