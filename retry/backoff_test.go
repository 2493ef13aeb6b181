package retry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/retry"
	"github.com/sluice-rl/sluice/retry/retrytest"
)

func TestBackoff(t *testing.T) {
	p := retry.Policy{Initial: 100 * time.Millisecond, Max: 400 * time.Millisecond, Jitter: -1, MaxAttempts: 5}
	b := p.Backoff(retrytest.NewClock(time.Unix(0, 0)))
	steps := []struct {
		floor time.Duration
		want  time.Duration
	}{
		{0, 100 * time.Millisecond},
		{0, 200 * time.Millisecond},
		{time.Second, time.Second},  // a Retry-After above the delay is a floor
		{0, 400 * time.Millisecond}, // capped at Max; the floor did not move the sequence
	}
	for i, s := range steps {
		got, ok := b.Next(s.floor)
		if !ok || got != s.want {
			t.Fatalf("step %d: Next(%v) = %v, %v; want %v, true", i, s.floor, got, ok, s.want)
		}
	}
	if _, ok := b.Next(0); ok {
		t.Fatal("Next after MaxAttempts-1 retries: ok, want spent")
	}
	if err := b.Wait(context.Background(), 0); !errors.Is(err, retry.ErrGiveUp) {
		t.Fatalf("Wait when spent = %v, want ErrGiveUp", err)
	}
	b.Reset()
	if got, ok := b.Next(0); !ok || got != 100*time.Millisecond {
		t.Fatalf("Next after Reset = %v, %v; want 100ms, true", got, ok)
	}
}

func TestBackoffWaitHonoursContext(t *testing.T) {
	b := retry.Policy{Initial: time.Hour}.Backoff(nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Wait(ctx, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait on a canceled context = %v, want context.Canceled", err)
	}
}

func TestBackoffWaitsOnItsClock(t *testing.T) {
	c := retrytest.NewClock(time.Unix(0, 0))
	b := retry.Policy{Initial: 50 * time.Millisecond, Jitter: -1}.Backoff(c)
	done := make(chan error, 1)
	go func() { done <- b.Wait(context.Background(), 80*time.Millisecond) }()
	if err := c.BlockUntilWaiters(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if w := c.Waits(); len(w) != 1 || w[0] != 80*time.Millisecond {
		t.Fatalf("waits = %v, want [80ms] (the floor)", w)
	}
	c.Advance(80 * time.Millisecond)
	if err := <-done; err != nil {
		t.Fatalf("Wait = %v", err)
	}
}
