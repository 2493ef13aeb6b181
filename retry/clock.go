package retry

import (
	"context"
	"time"
)

// Clock is the source of time for code that waits between attempts. It is a superset of
// backoff.Clock, so a Clock can drive a [Policy.NewBackOffClock] as well.
//
// Implementations must be safe for concurrent use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// After returns a channel that receives the time once d has elapsed, like time.After.
	After(d time.Duration) <-chan time.Time
}

// SystemClock is the real clock: time.Now and time.After.
var SystemClock Clock = systemClock{}

type systemClock struct{}

func (systemClock) Now() time.Time                         { return time.Now() }
func (systemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Sleep waits for d on clock c (nil means SystemClock) or until ctx is done, whichever comes
// first. It returns nil after a full wait and ctx.Err() otherwise; a context that is already
// done wins even when d <= 0, so a retry loop built on Sleep stops promptly.
func Sleep(ctx context.Context, c Clock, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	if c == nil {
		c = SystemClock
	}
	select {
	case <-c.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
