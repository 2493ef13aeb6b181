package gcfloor

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	for _, c := range []struct {
		floor, live int64
		want        int
	}{
		{64 << 20, 4 << 20, 1500},  // goal 4 MiB × 16 = 64 MiB
		{64 << 20, 32 << 20, 100},  // half the floor: GOGC=100 reaches it
		{64 << 20, 100 << 20, 100}, // over the floor: never below the default
		{64 << 20, 16 << 20, 300},  // 16 MiB × 4
		{64 << 20, 1 << 20, 1600},  // the minimum heap, 4 MiB × 16, holds the goal at the floor
		{64 << 20, 0, 1600},        // nothing live yet: the same
		{8 << 20, 1 << 20, 200},    // a floor of twice the minimum heap
	} {
		if got := percent(c.floor, c.live); got != c.want {
			t.Errorf("percent(%d, %d) = %d, want %d", c.floor, c.live, got, c.want)
		}
	}
}

// gogc reads the GC percentage in force.
func gogc() uint64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestSetFollowsTheLiveHeap sets a floor in this process and checks the percentage after
// collections: raised while little is live, back at the default once the live heap is over
// half the floor. The tuner runs in the finalizer goroutine after a collection, so the test
// collects until it sees the value (a bounded loop, not a sleep standing in for an event).
func TestSetFollowsTheLiveHeap(t *testing.T) {
	t.Setenv("GOGC", "200")
	if Set(1 << 30) {
		t.Fatal("Set with GOGC in the environment changed the collector")
	}
	unsetenv(t, "GOGC")
	t.Cleanup(reset)
	const floor = 64 << 20
	if !Set(floor) {
		t.Fatal("Set did nothing")
	}
	if Set(floor) {
		t.Fatal("a second Set took effect")
	}
	waitFor(t, "percentage raised for a small heap", func() bool { return gogc() > 400 })

	held := make([][]byte, 48)
	for i := range held {
		held[i] = make([]byte, 1<<20)
	}
	waitFor(t, "percentage back to 100 with 48 MiB live", func() bool { return gogc() == base })
	runtime.KeepAlive(held)
	held = nil
	waitFor(t, "percentage raised again once the heap is released", func() bool { return gogc() > 400 })
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: GOGC is %d", what, gogc())
		}
		runtime.GC()
		runtime.Gosched()
	}
}

// unsetenv removes key from the environment for the rest of the test, restoring it after.
func unsetenv(t *testing.T, key string) {
	t.Helper()
	old, had := os.LookupEnv(key)
	if err := os.Unsetenv(key); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if had {
			os.Setenv(key, old)
		}
	})
}

// reset stops the floor Set installed and restores the default percentage.
func reset() {
	mu.Lock()
	defer mu.Unlock()
	if current != nil {
		current.stopped.Store(true)
		current = nil
	}
	debug.SetGCPercent(base)
}
