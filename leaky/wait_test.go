package leaky

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/retry/retrytest"
)

// epoch is where the fake clocks of the tests start.
var epoch = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// pausing pauses the queue right after its first take — as another worker hitting a 429 would
// while this one sleeps for its slot — and counts takes.
type pausing struct {
	Schedule
	pause time.Duration
	takes atomic.Int32
}

func (p *pausing) Take(ctx context.Context, queue string, r Rate) (Slot, error) {
	slot, err := p.Schedule.Take(ctx, queue, r)
	if p.takes.Add(1) == 1 && err == nil {
		err = p.Schedule.Pause(ctx, queue, p.pause)
	}
	return slot, err
}

func TestWait(t *testing.T) {
	for _, d := range drivers(t) {
		t.Run(d.name, func(t *testing.T) {
			// A free slot is used at once, in one take. A waiter the machine let reach it later
			// than its tolerance gives it up and takes another, as it should; such an attempt
			// shows nothing and is made again, on a new schedule, up to 5 times.
			t.Run("go now", func(t *testing.T) {
				for attempt := 1; ; attempt++ {
					s := &pausing{Schedule: d.new(t, nil)}
					var late []time.Duration
					h := Hooks{OnGiveUp: func(l time.Duration) { late = append(late, l) }}
					if err := WaitHooks(context.Background(), s, "q", perSecond10, h); err != nil {
						t.Fatal(err)
					}
					n := s.takes.Load()
					if n == 1 {
						return
					}
					if int(n) != 1+len(late) || slices.ContainsFunc(late, func(l time.Duration) bool { return l <= perSecond10.Tolerance() }) {
						t.Fatalf("%d takes, slots given up %v late", n, late)
					}
					t.Logf("attempt %d: the free slot was given up %v late (tolerance %v)", attempt, late, perSecond10.Tolerance())
					if attempt == 5 {
						t.Fatalf("in 5 attempts the machine always let the waiter reach its free slot too late")
					}
				}
			})

			t.Run("sleeps until the slot", func(t *testing.T) {
				s := d.new(t, nil)
				r := Rate{Interval: 50 * time.Millisecond}
				start := time.Now()
				take(t, s, "q", r) // the next slot is 50ms after this one, at least 50ms after start
				if err := Wait(context.Background(), s, "q", r, nil); err != nil {
					t.Fatal(err)
				}
				if el := time.Since(start); el < 50*time.Millisecond {
					t.Fatalf("returned after %v, before the slot 50ms away", el)
				}
			})

			t.Run("pause during the sleep", func(t *testing.T) {
				// Wait's slot is 100ms away, inside the 250ms pause that starts after it is taken.
				s := &pausing{Schedule: d.new(t, nil), pause: 250 * time.Millisecond}
				r := Rate{Interval: 100 * time.Millisecond}
				take(t, s.Schedule, "q", r)
				start := time.Now()
				if err := Wait(context.Background(), s, "q", r, nil); err != nil {
					t.Fatal(err)
				}
				if el := time.Since(start); el < 250*time.Millisecond {
					t.Fatalf("returned after %v, inside the 250ms pause", el)
				}
				if n := s.takes.Load(); n != 2 {
					t.Fatalf("%d takes, want 2 (a new slot after the pause)", n)
				}
			})

			// On a fake clock shared by the schedule and the wait, Wait returns exactly at
			// the slot, and after a pause exactly at its end, without sleeping.
			t.Run("fake clock: exactly at the slot", func(t *testing.T) {
				c := retrytest.NewAutoClock(epoch)
				s := d.new(t, c.Now)
				r := Rate{Interval: 50 * time.Millisecond}
				take(t, s, "q", r)
				var onSlot []time.Duration
				if err := WaitHooks(context.Background(), s, "q", r, Hooks{Clock: c, OnSlot: func(late time.Duration) { onSlot = append(onSlot, late) }}); err != nil {
					t.Fatal(err)
				}
				if el := c.Now().Sub(epoch); el != 50*time.Millisecond || len(onSlot) != 1 || onSlot[0] != 0 {
					t.Fatalf("returned after %v, OnSlot %v; want at the slot 50ms away, 0 late", el, onSlot)
				}
				// The sleeps: to checkLead before the slot, then the rest of the way.
				if w := c.Waits(); len(w) != 2 || w[0] != 50*time.Millisecond-checkLead || w[1] != checkLead {
					t.Fatalf("slept %v, want [%v %v]", w, 50*time.Millisecond-checkLead, checkLead)
				}
			})

			t.Run("fake clock: exactly at the pause's end", func(t *testing.T) {
				c := retrytest.NewAutoClock(epoch)
				s := &pausing{Schedule: d.new(t, c.Now), pause: 250 * time.Millisecond}
				r := Rate{Interval: 100 * time.Millisecond}
				take(t, s.Schedule, "q", r)
				if err := WaitHooks(context.Background(), s, "q", r, Hooks{Clock: c}); err != nil {
					t.Fatal(err)
				}
				if el := c.Now().Sub(epoch); el != 250*time.Millisecond {
					t.Fatalf("returned after %v, want at the end of the 250ms pause", el)
				}
				if n := s.takes.Load(); n != 2 {
					t.Fatalf("%d takes, want 2 (a new slot after the pause)", n)
				}
			})

			t.Run("ctx cancelled mid-sleep", func(t *testing.T) {
				s := d.new(t, nil)
				r := Rate{Interval: time.Minute}
				take(t, s, "q", r)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				sleeping := make(chan time.Duration, 1)
				done := make(chan error, 1)
				go func() {
					done <- Wait(ctx, s, "q", r, func(left time.Duration) {
						select {
						case sleeping <- left:
						default:
						}
					})
				}()
				if left := <-sleeping; left < 59*time.Second || left > time.Minute {
					t.Fatalf("onWait(%v), want about 1m", left)
				}
				cancel()
				select {
				case err := <-done:
					if !errors.Is(err, context.Canceled) {
						t.Fatalf("Wait returned %v, want context.Canceled", err)
					}
				case <-time.After(2 * time.Second):
					t.Fatal("Wait did not return after cancel")
				}
			})

			t.Run("ctx already done", func(t *testing.T) {
				s := &pausing{Schedule: d.new(t, nil)}
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				if err := Wait(ctx, s, "q", perSecond10, nil); !errors.Is(err, context.Canceled) {
					t.Fatalf("Wait = %v", err)
				}
				if n := s.takes.Load(); n != 0 {
					t.Fatalf("%d slots taken with a dead ctx", n)
				}
			})

			t.Run("invalid rate", func(t *testing.T) {
				if err := Wait(context.Background(), d.new(t, nil), "q", Rate{}, nil); !errors.Is(err, ErrInvalidRate) {
					t.Fatalf("Wait = %v", err)
				}
			})
		})
	}
}

// TestSleepProgress: long sleeps report progress before and periodically during the sleep, with
// the time left; short ones do not. On a fake clock the calls are exact; the real clock sleeps
// at least as long as asked.
func TestSleepProgress(t *testing.T) {
	const d, threshold, period = 200 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond
	c := retrytest.NewAutoClock(epoch)
	sl := &sleeper{clock: c}
	var calls []time.Duration
	record := func(left time.Duration) { calls = append(calls, left) }
	if err := sl.sleep(context.Background(), d, record, threshold, period); err != nil {
		t.Fatal(err)
	}
	if el := c.Now().Sub(epoch); el != d {
		t.Fatalf("slept %v, want %v", el, d)
	}
	// Called first with d left, then every period while at least the threshold is left.
	want := []time.Duration{200 * ms, 170 * ms, 140 * ms, 110 * ms, 80 * ms, 50 * ms, 20 * ms}
	if !slices.Equal(calls, want) {
		t.Fatalf("onWait calls %v, want %v", calls, want)
	}
	// Short sleeps do not report.
	calls = nil
	if err := sl.sleep(context.Background(), threshold/2, record, threshold, period); err != nil || len(calls) != 0 {
		t.Fatalf("short sleep: %v, onWait %v", err, calls)
	}

	// The real clock, with its one timer reused across sleeps.
	sys := &sleeper{}
	defer sys.stop()
	calls = nil
	start := time.Now()
	for range 2 {
		if err := sys.sleep(context.Background(), 30*time.Millisecond, record, threshold, period); err != nil {
			t.Fatal(err)
		}
	}
	if el := time.Since(start); el < 60*time.Millisecond || len(calls) < 2 || calls[0] > 30*time.Millisecond {
		t.Fatalf("real clock: two 30ms sleeps took %v, onWait %v; want ≥ 60ms and a call before each", el, calls)
	}
	// A cancelled context ends a sleep on a clock that never fires.
	ctx, cancel := context.WithCancel(context.Background())
	manual := retrytest.NewClock(epoch)
	done := make(chan error, 1)
	go func() { done <- (&sleeper{clock: manual}).sleep(ctx, time.Hour, nil, threshold, period) }()
	if err := manual.BlockUntilWaiters(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled sleep = %v, want context.Canceled", err)
	}
}

// stalling stalls its first PausedFor — as a worker SIGSTOPped or starved of CPU right around
// its slot would be — and counts takes.
type stalling struct {
	Schedule
	clock   *retrytest.Clock
	stall   time.Duration
	stalled atomic.Bool
	takes   atomic.Int32
}

func (s *stalling) Take(ctx context.Context, queue string, r Rate) (Slot, error) {
	s.takes.Add(1)
	return s.Schedule.Take(ctx, queue, r)
}

func (s *stalling) PausedFor(ctx context.Context, queue string) (time.Duration, error) {
	if !s.stalled.Swap(true) {
		s.clock.Advance(s.stall) // the stall under test
	}
	return s.Schedule.PausedFor(ctx, queue)
}

// TestWaitGivesUpLateSlots: a slot that Wait wakes for later than the rate's tolerance is
// given up and a new one taken, never spent late; on time, nothing is given up.
func TestWaitGivesUpLateSlots(t *testing.T) {
	for _, d := range drivers(t) {
		t.Run(d.name, func(t *testing.T) {
			ctx := context.Background()
			c := retrytest.NewAutoClock(epoch)
			inner := d.new(t, c.Now)
			s := &stalling{Schedule: inner, clock: c, stall: 300 * time.Millisecond}
			if _, err := inner.Take(ctx, "q", perSecond10); err != nil { // a backlog: the next slot is 100ms out
				t.Fatal(err)
			}
			var lates []time.Duration
			hooks := Hooks{Clock: c, OnGiveUp: func(late time.Duration) { lates = append(lates, late) }}
			if err := WaitHooks(ctx, s, "q", perSecond10, hooks); err != nil {
				t.Fatal(err)
			}
			// Woken 10ms before the slot 100ms out, stalled 300ms: 290ms late.
			if len(lates) != 1 || lates[0] != 290*time.Millisecond {
				t.Fatalf("given up %v, want one slot given up 290ms late", lates)
			}
			if n := s.takes.Load(); n != 2 {
				t.Fatalf("%d takes, want 2: the late slot and its replacement", n)
			}
			// On time: no slot is given up.
			lates = nil
			for range 3 {
				if err := WaitHooks(ctx, s, "q", perSecond10, hooks); err != nil {
					t.Fatal(err)
				}
			}
			if len(lates) != 0 {
				t.Fatalf("slots given up on an unstalled schedule: %v", lates)
			}
		})
	}
}

// Up to StrictRate a slot's tolerance is half an interval, so that no second holds more than
// rate + burst + 1 deliveries; above it, MinTolerance.
func TestTolerance(t *testing.T) {
	for _, c := range []struct {
		perSecond float64
		want      time.Duration
	}{
		{1, 500 * time.Millisecond},
		{50, 10 * time.Millisecond},
		{100, 5 * time.Millisecond},
		{200, 2500 * time.Microsecond},
		{500, MinTolerance},
		{2000, MinTolerance},
	} {
		r := Rate{Interval: time.Duration(float64(time.Second) / c.perSecond)}
		if got := r.Tolerance(); got != c.want {
			t.Errorf("%v/s: tolerance %v, want %v", c.perSecond, got, c.want)
		}
		if c.perSecond <= StrictRate && r.Tolerance() >= r.Interval {
			t.Errorf("%v/s: tolerance %v is not under the interval %v", c.perSecond, r.Tolerance(), r.Interval)
		}
	}
}
