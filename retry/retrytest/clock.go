// Package retrytest provides a fake [retry.Clock] so tests of retrying code never really
// sleep.
//
// Two modes cover the usual needs:
//
//   - NewAutoClock: every After fires at once and moves the clock forward by its duration, as
//     if the wait had happened instantly. A retry loop then runs to completion at full speed
//     and Waits reports exactly which waits it asked for.
//   - NewClock: After blocks until the test calls Advance; BlockUntilWaiters lets the test
//     synchronise with the code under test (for instance, to cancel a context mid-wait).
package retrytest

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/retry"
)

var _ retry.Clock = (*Clock)(nil)

// Clock is a fake retry.Clock. It is safe for concurrent use.
type Clock struct {
	mu      sync.Mutex
	now     time.Time
	auto    bool
	waits   []time.Duration
	pending []timer
	added   chan struct{} // closed (and replaced) whenever a timer is added
}

type timer struct {
	at time.Time
	ch chan time.Time
}

// NewClock returns a manual clock reading start; time moves only through Advance.
func NewClock(start time.Time) *Clock {
	return &Clock{now: start, added: make(chan struct{})}
}

// NewAutoClock returns a clock reading start on which After(d) advances the clock by d and
// fires at once.
func NewAutoClock(start time.Time) *Clock {
	c := NewClock(start)
	c.auto = true
	return c
}

// Now returns the fake current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After records d and returns a channel that receives the fake time once the clock reaches
// now+d (immediately for d <= 0 and on an auto clock).
func (c *Clock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waits = append(c.waits, d)
	ch := make(chan time.Time, 1)
	switch {
	case d <= 0:
		ch <- c.now
	case c.auto:
		c.now = c.now.Add(d)
		ch <- c.now
	default:
		c.pending = append(c.pending, timer{at: c.now.Add(d), ch: ch})
		close(c.added)
		c.added = make(chan struct{})
	}
	return ch
}

// Advance moves the clock forward by d and fires every timer that has become due.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.pending = slices.DeleteFunc(c.pending, func(t timer) bool {
		if t.at.After(c.now) {
			return false
		}
		t.ch <- c.now
		return true
	})
}

// Waits returns every duration passed to After so far, in call order.
func (c *Clock) Waits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.waits)
}

// BlockUntilWaiters returns once at least n timers are pending (created by After and not yet
// fired by Advance), or with ctx.Err() when ctx is done first.
func (c *Clock) BlockUntilWaiters(ctx context.Context, n int) error {
	for {
		c.mu.Lock()
		pending, added := len(c.pending), c.added
		c.mu.Unlock()
		if pending >= n {
			return nil
		}
		select {
		case <-added:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
