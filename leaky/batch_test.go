package leaky

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/retry/retrytest"
)

// TestTakeNIsTakesInARow: TakeN of n reserves what n Takes right after each other would, with
// and without a burst, after idleness and behind a pause, and leaves the state the same.
func TestTakeNIsTakesInARow(t *testing.T) {
	for _, r := range []Rate{{Interval: 7 * ms}, {Interval: 5 * ms, Burst: 3}} {
		t.Run(r.String(), func(t *testing.T) {
			forEach(t, func(t *testing.T, s Schedule, c *clock) {
				ctx := context.Background()
				bt := s.(BatchTaker)
				rng := rand.New(rand.NewPCG(3, 4))
				for round := range 20 {
					c.Advance(time.Duration(rng.IntN(60)) * ms)
					if round == 7 {
						if err := s.Pause(ctx, "q", 30*ms); err != nil {
							t.Fatal(err)
						}
						if err := s.Pause(ctx, "ref", 30*ms); err != nil {
							t.Fatal(err)
						}
					}
					n := 1 + rng.IntN(9)
					got, err := bt.TakeN(ctx, "q", r, n)
					if err != nil {
						t.Fatal(err)
					}
					if len(got) != n {
						t.Fatalf("round %d: %d slots for %d", round, len(got), n)
					}
					for i := range n {
						want, err := s.Take(ctx, "ref", r)
						if err != nil {
							t.Fatal(err)
						}
						if got[i].Wait != want.Wait || !got[i].At.Equal(want.At) {
							t.Fatalf("round %d, slot %d of %d: wait %v at %v; %d Takes in a row give wait %v at %v",
								round, i, n, got[i].Wait, got[i].At, n, want.Wait, want.At)
						}
					}
				}
			})
		})
	}
}

// gated counts a BatchTaker's calls of TakeN and the slots they asked for, and holds the
// first call, closing entered, until open is closed.
type gated struct {
	BatchTaker
	entered, open chan struct{}
	calls, slots  atomic.Int64
}

func (g *gated) TakeN(ctx context.Context, queue string, r Rate, n int) ([]Slot, error) {
	if g.calls.Add(1) == 1 {
		close(g.entered)
		<-g.open
	}
	g.slots.Add(int64(n))
	return g.BatchTaker.TakeN(ctx, queue, r, n)
}

// TestCoalescedTakes: Takes that arrive while a call is in flight are served by the calls
// after it, MaxBatch at a time, and get every slot of the schedule once, spaced as the rate
// says; a Take after them continues the schedule where they left it.
func TestCoalescedTakes(t *testing.T) {
	forEach(t, func(t *testing.T, s Schedule, c *clock) {
		if _, ok := s.(checker); ok {
			if _, ok := Coalesce(s).(checker); !ok {
				t.Fatal("Coalesce hid the schedule's check of slots")
			}
		}
		const n = 200
		g := &gated{BatchTaker: s.(BatchTaker), entered: make(chan struct{}), open: make(chan struct{})}
		cs := Coalesce(g).(*coalesced)
		waits := make(chan time.Duration, n)
		var wg sync.WaitGroup
		takeOne := func() {
			slot, err := cs.Take(context.Background(), "q", Rate{Interval: ms})
			if err != nil {
				t.Error(err)
			}
			waits <- slot.Wait
		}
		// The first Take's call is held; the others arrive while it is in flight.
		wg.Go(takeOne)
		<-g.entered
		for range n - 1 {
			wg.Go(takeOne)
		}
		// Wait until every other Take is queued behind the first.
		for deadline := time.Now().Add(10 * time.Second); ; {
			cs.mu.Lock()
			queued := 0
			if l := cs.lines["q"]; l != nil {
				queued = len(l.waiting)
			}
			cs.mu.Unlock()
			if queued == n-1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d Takes queued behind the first after 10s, want %d", queued, n-1)
			}
			time.Sleep(time.Millisecond)
		}
		close(g.open)
		wg.Wait()
		close(waits)
		seen := map[time.Duration]int{}
		for w := range waits {
			seen[w]++
		}
		for i := range n {
			if seen[time.Duration(i)*ms] != 1 {
				t.Fatalf("the slot at %v went to %d Takes, want 1", time.Duration(i)*ms, seen[time.Duration(i)*ms])
			}
		}
		if want := 1 + (n-1+MaxBatch-1)/MaxBatch; g.calls.Load() != int64(want) || g.slots.Load() != n {
			t.Fatalf("%d Takes made %d calls for %d slots; want %d calls, %d slots", n, g.calls.Load(), g.slots.Load(), want, n)
		}
		if got := take(t, cs, "q", Rate{Interval: ms}); got != n*ms {
			t.Fatalf("the next Take waits %v, want %v", got, n*ms)
		}
	})
}

// TestCoalescedTakeCanceled: a Take whose ctx has ended returns its error, and the Takes
// after it still get their slots.
func TestCoalescedTakeCanceled(t *testing.T) {
	forEach(t, func(t *testing.T, s Schedule, c *clock) {
		cs := Coalesce(s)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := cs.Take(ctx, "q", perSecond10); err != context.Canceled {
			t.Fatalf("Take with an ended ctx: %v, want context.Canceled", err)
		}
		if got := take(t, cs, "q", perSecond10); got != 0 {
			t.Fatalf("the next Take waits %v, want 0 (the canceled one reserved nothing)", got)
		}
		if got := take(t, cs, "q", perSecond10); got != 100*ms {
			t.Fatalf("the Take after it waits %v, want 100ms", got)
		}
	})
}

// checks counts PausedFor, which Wait calls to check a slot before it on a schedule without
// a check of its own (Memory).
type checks struct {
	Schedule
	n atomic.Int32
}

func (c *checks) PausedFor(ctx context.Context, queue string) (time.Duration, error) {
	c.n.Add(1)
	return c.Schedule.PausedFor(ctx, queue)
}

// TestWaitChecksOnlySlotsAfterCheckMin: a slot at most checkMin after its take — as the slots
// of a batch at a high rate are — is used without asking about pauses, which no answer could
// tell in time; a later one is checked before it. On a fake clock shared by the schedule and
// the wait: on the real one a process that wakes more than the slot's tolerance late (a loaded
// machine's, beside two busy loops) gives the slot up and checks the next one too.
func TestWaitChecksOnlySlotsAfterCheckMin(t *testing.T) {
	for _, cs := range []struct {
		interval time.Duration
		checks   int32
	}{{checkMin, 0}, {20 * checkMin, 1}} {
		t.Run(cs.interval.String(), func(t *testing.T) {
			clk := retrytest.NewAutoClock(epoch)
			c := &checks{Schedule: NewMemory(clk.Now)}
			r := Rate{Interval: cs.interval}
			for range 2 { // the first slot is at once, the second an interval later
				if err := WaitHooks(context.Background(), c, "q", r, Hooks{Clock: clk}); err != nil {
					t.Fatal(err)
				}
			}
			if got := c.n.Load(); got != cs.checks {
				t.Fatalf("a slot %v after its take was checked %d times, want %d", cs.interval, got, cs.checks)
			}
			if el := clk.Now().Sub(epoch); el != cs.interval {
				t.Fatalf("the second slot let go %v after the first, want %v", el, cs.interval)
			}
		})
	}
}
