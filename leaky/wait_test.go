package leaky

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

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
			t.Run("go now", func(t *testing.T) {
				s := &pausing{Schedule: d.new(t, nil)}
				if err := Wait(context.Background(), s, "q", perSecond10, nil); err != nil {
					t.Fatal(err)
				}
				if n := s.takes.Load(); n != 1 {
					t.Fatalf("%d takes", n)
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
// the time left; short ones do not.
func TestSleepProgress(t *testing.T) {
	const d, threshold, period = 200 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond
	var calls []time.Duration
	var timer *time.Timer
	defer func() { timer.Stop() }()
	start := time.Now()
	err := sleep(context.Background(), &timer, d, func(left time.Duration) {
		calls = append(calls, left)
	}, threshold, period)
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < d {
		t.Fatalf("slept %v, less than %v", el, d)
	}
	// Called first with about d left, then about every period (timers never fire early, so never
	// more often) while at least the threshold is left. Only a stall of the whole test for most of
	// d could leave a single call.
	if len(calls) < 2 || len(calls) > int(d/period)+1 {
		t.Fatalf("onWait calls %v: want 2 to %d", calls, int(d/period)+1)
	}
	if calls[0] > d || calls[0] < d-period {
		t.Fatalf("first onWait(%v), want about %v", calls[0], d)
	}
	for i := 1; i < len(calls); i++ {
		if calls[i] > calls[i-1]-period || calls[i] < threshold {
			t.Fatalf("onWait calls %v: closer than the period or below the threshold", calls)
		}
	}
	// Short sleeps do not report.
	calls = nil
	if err := sleep(context.Background(), &timer, threshold/2, func(left time.Duration) {
		calls = append(calls, left)
	}, threshold, period); err != nil || len(calls) != 0 {
		t.Fatalf("short sleep: %v, onWait %v", err, calls)
	}
}

// stalling stalls its first PausedFor — as a worker SIGSTOPped or starved of CPU right around
// its slot would be — and counts takes.
type stalling struct {
	Schedule
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
		time.Sleep(s.stall) // the stall under test
	}
	return s.Schedule.PausedFor(ctx, queue)
}

// TestWaitGivesUpLateSlots: a slot that Wait wakes for later than the rate's tolerance is
// given up and a new one taken, never spent late; on time, nothing is given up.
func TestWaitGivesUpLateSlots(t *testing.T) {
	for _, d := range drivers(t) {
		t.Run(d.name, func(t *testing.T) {
			ctx := context.Background()
			inner := d.new(t, nil)
			s := &stalling{Schedule: inner, stall: 300 * time.Millisecond}
			if _, err := inner.Take(ctx, "q", perSecond10); err != nil { // a backlog: the next slot is 100ms out
				t.Fatal(err)
			}
			var lates []time.Duration
			err := WaitHooks(ctx, s, "q", perSecond10, Hooks{OnGiveUp: func(late time.Duration) { lates = append(lates, late) }})
			if err != nil {
				t.Fatal(err)
			}
			if len(lates) != 1 || lates[0] < 200*time.Millisecond {
				t.Fatalf("given up %v, want one slot given up ~250ms late", lates)
			}
			if n := s.takes.Load(); n != 2 {
				t.Fatalf("%d takes, want 2: the late slot and its replacement", n)
			}
			// On time: no slot is given up.
			lates = nil
			for range 3 {
				if err := WaitHooks(ctx, s, "q", perSecond10, Hooks{OnGiveUp: func(late time.Duration) { lates = append(lates, late) }}); err != nil {
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
