package retry_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/retry"
	"github.com/sluice-rl/sluice/retry/retrytest"
)

// waitCtx bounds how long a test waits for a condition before failing; it is never slept.
func waitCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestSleepFullWait(t *testing.T) {
	clock := retrytest.NewClock(t0)
	done := make(chan error, 1)
	go func() { done <- retry.Sleep(context.Background(), clock, 5*time.Second) }()

	if err := clock.BlockUntilWaiters(waitCtx(t), 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(4 * time.Second)
	select {
	case err := <-done:
		t.Fatalf("Sleep returned %v after 4s of a 5s wait", err)
	default:
	}
	clock.Advance(time.Second)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Sleep = %v, want nil", err)
		}
	case <-waitCtx(t).Done():
		t.Fatal("Sleep did not return once the clock reached the deadline")
	}
}

func TestSleepCancelledMidWait(t *testing.T) {
	clock := retrytest.NewClock(t0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- retry.Sleep(ctx, clock, time.Hour) }()

	if err := clock.BlockUntilWaiters(waitCtx(t), 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Sleep = %v, want context.Canceled", err)
		}
	case <-waitCtx(t).Done():
		t.Fatal("Sleep ignored the cancellation")
	}
}

func TestSleepShortcuts(t *testing.T) {
	clock := retrytest.NewClock(t0)
	if err := retry.Sleep(context.Background(), clock, 0); err != nil {
		t.Errorf("Sleep(0) = %v", err)
	}
	if err := retry.Sleep(context.Background(), clock, -time.Second); err != nil {
		t.Errorf("Sleep(-1s) = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := retry.Sleep(ctx, clock, 0); !errors.Is(err, context.Canceled) {
		t.Errorf("Sleep(0) on a cancelled context = %v, want context.Canceled", err)
	}
	if err := retry.Sleep(ctx, clock, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("Sleep(1h) on a cancelled context = %v, want context.Canceled", err)
	}
	if w := clock.Waits(); len(w) != 0 {
		t.Errorf("no timer should have been started, got waits %v", w)
	}
}

func TestSleepSystemClock(t *testing.T) {
	if err := retry.Sleep(context.Background(), nil, time.Millisecond); err != nil {
		t.Errorf("Sleep on the system clock = %v", err)
	}
	if now := retry.SystemClock.Now(); time.Since(now) > time.Minute || time.Since(now) < 0 {
		t.Errorf("SystemClock.Now() = %v, not the real time", now)
	}
}

func TestAutoClock(t *testing.T) {
	clock := retrytest.NewAutoClock(t0)
	for _, d := range []time.Duration{time.Second, 3 * time.Second} {
		if err := retry.Sleep(context.Background(), clock, d); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := clock.Now(), t0.Add(4*time.Second); !got.Equal(want) {
		t.Errorf("Now = %v, want %v", got, want)
	}
	if got, want := clock.Waits(), []time.Duration{time.Second, 3 * time.Second}; !slices.Equal(got, want) {
		t.Errorf("Waits = %v, want %v", got, want)
	}
}
