package worker

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/leaky"
)

// TestTurns: jobs take their slots together only where their slots fit in a tenth of the
// reservation lead; at tens of slots a second, one at a time.
func TestTurns(t *testing.T) {
	for _, c := range []struct {
		perSecond int64
		want      int
	}{{10, 1}, {50, 1}, {99, 1}, {200, 2}, {500, 5}, {2000, maxTurns}, {1000000, maxTurns}} {
		if got := turns(leaky.Every(c.perSecond, time.Second)); got != c.want {
			t.Errorf("turns(%d/s) = %d, want %d", c.perSecond, got, c.want)
		}
	}
}

// TestTurnGate: never more holders than the limit, every waiter served in turn, and a waiter
// whose ctx ends leaves no turn taken.
func TestTurnGate(t *testing.T) {
	var g turnGate
	const limit, jobs = 3, 200
	var in, most atomic.Int64
	var wg sync.WaitGroup
	for range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := g.acquire(context.Background(), limit); err != nil {
				t.Error(err)
				return
			}
			n := in.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			in.Add(-1)
			g.release(limit)
		}()
	}
	wg.Wait()
	if m := most.Load(); m > limit || m < 1 {
		t.Fatalf("at most %d holders at once, want 1..%d", m, limit)
	}

	// Full: a waiter whose ctx ends gives up, and the turns it did not take stay free.
	for range limit {
		if err := g.acquire(context.Background(), limit); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- g.acquire(ctx, limit) }()
	cancel()
	if err := <-done; err == nil {
		t.Fatal("acquire on a full gate returned nil after its ctx ended")
	}
	for range limit {
		g.release(limit)
	}
	g.mu.Lock()
	out, waiting := g.out, len(g.waiters)
	g.mu.Unlock()
	if out != 0 || waiting != 0 {
		t.Fatalf("after every release: %d out, %d waiting; want 0, 0", out, waiting)
	}
}

// TestTurnGrid: turns wake on multiples of turnGrid, never before their time.
func TestTurnGrid(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	for _, c := range []struct{ in, want time.Duration }{
		{0, 0}, {time.Nanosecond, turnGrid}, {turnGrid, turnGrid}, {turnGrid + 1, 2 * turnGrid},
	} {
		if got := onTurnGrid(base.Add(c.in)); !got.Equal(base.Add(c.want)) {
			t.Errorf("onTurnGrid(+%v) = +%v, want +%v", c.in, got.Sub(base), c.want)
		}
	}
}

// TestFreedWakesFetchWhenDue counts the fetch loop's wake-ups as the 64 jobs of a runner
// finish one by one: while jobs wait for their slots, one per job only from a batch
// (fetchBatch, 16) free on, so 49; with none waiting, or a fair queue, one per job.
func TestFreedWakesFetchWhenDue(t *testing.T) {
	for _, c := range []struct {
		name    string
		fair    bool
		waiters int64
		want    int
	}{
		{"slot waiters", false, 5, 49},
		{"no slot waiter", false, 0, 64},
		{"fair", true, 5, 64},
	} {
		r := &runner{p: &Pool{}, wake: make(chan struct{}, 1)}
		r.cfg.Store(&QueueConfig{Concurrency: 64, Fair: c.fair})
		r.slotWaiters.Store(c.waiters)
		woken := 0
		for left := int64(63); left >= 0; left-- {
			r.freed(left)
			select {
			case <-r.wake:
				woken++
			default:
			}
		}
		if woken != c.want {
			t.Errorf("%s: the fetch loop woken %d times for 64 finished jobs, want %d", c.name, woken, c.want)
		}
	}
}
