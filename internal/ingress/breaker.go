package ingress

import (
	"sync"
	"sync/atomic"
	"time"
)

// BreakerState is the state of the circuit breaker in front of the limiter store, as the
// sluice_breaker_state gauge reports it.
type BreakerState int32

// The breaker states.
const (
	// BreakerClosed: the store is called for every decision.
	BreakerClosed BreakerState = 0
	// BreakerHalfOpen: the cool-down has passed; one probe call is let through, and the
	// rest are decided without the store until it answers.
	BreakerHalfOpen BreakerState = 1
	// BreakerOpen: the store failed repeatedly; decisions are made without it until the
	// cool-down passes.
	BreakerOpen BreakerState = 2
)

// String returns "closed", "half-open" or "open".
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerHalfOpen:
		return "half-open"
	default:
		return "open"
	}
}

// Breaker defaults.
const (
	DefaultBreakerFailures = 5
	DefaultBreakerCooldown = time.Second
	// DefaultBreakerTimeoutSpan is how long store calls must have been timing out, with no
	// success in between, before timeouts alone open the breaker.
	DefaultBreakerTimeoutSpan = 2 * time.Second
)

// outcome is how a store call ended, for the breaker.
type outcome uint8

const (
	succeeded outcome = iota
	// failedHard: the store refused or dropped the connection, or answered with an error —
	// it is unhealthy, whatever the state of this process.
	failedHard
	// timedOut: no answer within store_timeout. A store that is down times out, but so does a
	// healthy one whose answers wait for this process's CPU (a loaded machine, a GC pause).
	timedOut
)

// breaker is a circuit breaker in front of the limiter store: closed; open after threshold
// consecutive failures; half-open after cooldown (one probe at a time); closed again when a
// probe succeeds. It trips on the store being unhealthy, not on this process being slow: a run
// of failures opens it at once when any of them was a hard failure (connection refused or
// reset, an error answer), but a run of timeouts only once it has lasted timeoutSpan with no
// success in between — a process starved of CPU still sees some calls succeed, and its
// timed-out calls each fail open on their own without sending every decision in-process for a
// cool-down. The cost: against a store that hangs without closing connections, the breaker
// opens after timeoutSpan instead of after threshold calls, and each call meanwhile waits its
// store_timeout. It is safe for concurrent use; while closed and healthy it takes no lock.
type breaker struct {
	threshold   int32
	cooldown    time.Duration
	timeoutSpan time.Duration
	now         func() time.Time
	onChange    func(BreakerState)

	state    atomic.Int32 // BreakerState
	failures atomic.Int32 // consecutive, while closed
	hard     atomic.Bool  // a hard failure is among them
	since    atomic.Int64 // when the run of failures began, Unix ns

	mu       sync.Mutex
	openedAt time.Time
	probing  bool
}

func newBreaker(threshold int, cooldown time.Duration, now func() time.Time, onChange func(BreakerState)) *breaker {
	if threshold <= 0 {
		threshold = DefaultBreakerFailures
	}
	if cooldown <= 0 {
		cooldown = DefaultBreakerCooldown
	}
	return &breaker{threshold: int32(threshold), cooldown: cooldown, timeoutSpan: DefaultBreakerTimeoutSpan,
		now: now, onChange: onChange}
}

// allow reports whether a call may go to the store, and whether it is the probe of a
// half-open breaker. Every allowed call must be followed by done.
func (b *breaker) allow() (ok, probe bool) {
	if BreakerState(b.state.Load()) == BreakerClosed {
		return true, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch BreakerState(b.state.Load()) {
	case BreakerClosed:
		return true, false
	case BreakerOpen:
		if b.now().Sub(b.openedAt) < b.cooldown {
			return false, false
		}
		b.set(BreakerHalfOpen)
	}
	if b.probing {
		return false, false
	}
	b.probing = true
	return true, true
}

// done records the outcome of a call that allow let through.
func (b *breaker) done(probe bool, o outcome) {
	if !probe {
		if o == succeeded {
			if b.failures.Load() != 0 {
				b.failures.Store(0)
				b.hard.Store(false)
			}
			return
		}
		if b.failures.Add(1) == 1 {
			b.since.Store(b.now().UnixNano())
		}
		if o == failedHard {
			b.hard.Store(true)
		}
		if !b.tripped() {
			return
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
	}
	switch {
	case o == succeeded:
		b.reset()
		b.set(BreakerClosed)
	case probe || BreakerState(b.state.Load()) == BreakerClosed && b.tripped():
		b.reset()
		b.openedAt = b.now()
		b.set(BreakerOpen)
	}
}

// tripped reports whether the current run of failures opens the breaker.
func (b *breaker) tripped() bool {
	if b.failures.Load() < b.threshold {
		return false
	}
	return b.hard.Load() || b.now().Sub(time.Unix(0, b.since.Load())) >= b.timeoutSpan
}

func (b *breaker) reset() {
	b.failures.Store(0)
	b.hard.Store(false)
}

// abandon ends a call that allow let through without an outcome (its caller went away).
func (b *breaker) abandon(probe bool) {
	if probe {
		b.mu.Lock()
		b.probing = false
		b.mu.Unlock()
	}
}

// set changes the state; b.mu is held.
func (b *breaker) set(s BreakerState) {
	if BreakerState(b.state.Swap(int32(s))) != s && b.onChange != nil {
		b.onChange(s)
	}
}
