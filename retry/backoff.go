package retry

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// ErrGiveUp is returned by [Backoff.Wait] once the policy's MaxAttempts or MaxElapsed is
// spent: the loop should stop retrying.
var ErrGiveUp = errors.New("retry: gave up")

// Backoff spaces the tries of one retry loop: each wait is the policy's next exponential,
// jittered delay (cenkalti/backoff/v4), but never shorter than a floor the server asked for
// (Retry-After). Call Reset after a success, so the next failure starts from Initial again.
// Make one per loop with [Policy.Backoff]; it is not safe for concurrent use.
type Backoff struct {
	b     backoff.BackOff
	clock Clock
}

// Backoff returns a fresh Backoff for p whose waits (and MaxElapsed) run on c; a nil c means
// SystemClock.
func (p Policy) Backoff(c Clock) *Backoff {
	if c == nil {
		c = SystemClock
	}
	return &Backoff{b: p.NewBackOffClock(c), clock: c}
}

// Next returns the wait before the next try: the policy's next delay, raised to floor when
// floor is longer. ok is false once the policy is spent (MaxAttempts tries made, or the wait
// would end past MaxElapsed); the loop should stop then.
func (b *Backoff) Next(floor time.Duration) (wait time.Duration, ok bool) {
	d := b.b.NextBackOff()
	if d == backoff.Stop {
		return 0, false
	}
	return max(d, floor), true
}

// Reset starts the delays again from the policy's Initial, after a success.
func (b *Backoff) Reset() { b.b.Reset() }

// Wait sleeps Next(floor) on the Backoff's clock. It returns nil after the full wait,
// ctx.Err() when ctx ends first, and ErrGiveUp without waiting once the policy is spent.
func (b *Backoff) Wait(ctx context.Context, floor time.Duration) error {
	d, ok := b.Next(floor)
	if !ok {
		return ErrGiveUp
	}
	return Sleep(ctx, b.clock, d)
}
