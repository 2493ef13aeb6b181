package inflight

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Cap is one concurrency cap: at most Limit places of Key held at once. Limit must be >= 1
// and Key non-empty.
type Cap struct {
	Key   string
	Limit int64
}

// Lease is a set of places taken together by Acquire. It is a small value; hand it to
// Release, of the store that gave it out, to give the places back.
type Lease struct {
	// ID is random, unique per acquisition.
	ID string
	// Keys are the caps' keys it holds a place of, in the order of the Acquire's caps.
	Keys []string
}

// Result is the answer to an Acquire.
type Result struct {
	// Acquired reports whether a place of every cap was taken.
	Acquired bool
	// Lease holds the places when Acquired; its zero value otherwise.
	Lease Lease
	// InFlight is, per cap in the order given, the places held after this call (counting the
	// new one when Acquired).
	InFlight []int64
	// RetryAfter, when not Acquired: the time until the earliest held place of a full cap
	// expires — the longest such time when several caps are full. It is an upper bound on
	// the wait as long as no one else acquires; a Release can come sooner. 0 when Acquired.
	RetryAfter time.Duration
}

// Store holds concurrency places. Implementations are safe for concurrent use.
type Store interface {
	// Acquire takes one place under every cap at once, or none (all-or-nothing), held until
	// Release or until hold has passed, whichever comes first (a crashed holder's places come
	// back after hold). Over a cap is Result{Acquired:false}, not an error. Errors mean the
	// store could not decide; invalid input wraps ErrNoCaps, ErrEmptyKey, ErrDuplicateKey,
	// ErrInvalidLimit, ErrInvalidHold or ErrCrossSlot.
	Acquire(ctx context.Context, caps []Cap, hold time.Duration) (Result, error)
	// Release gives a lease's places back at once; releasing an expired or released lease is
	// a no-op.
	Release(ctx context.Context, l Lease) error
	// Wait blocks until a place under every cap is acquired (then returns its Result with
	// Acquired true), ctx ends (ctx.Err()), or the store fails. Waiters are woken by
	// Releases, with a fallback re-check at the earliest expiry (capped, for Redis, at the
	// store's recheck interval) so a lost notification only delays.
	Wait(ctx context.Context, caps []Cap, hold time.Duration) (Result, error)
	// InFlight reads the places held under each key (expired ones not counted).
	InFlight(ctx context.Context, keys ...string) ([]int64, error)
}

// Errors for invalid input, and of a closed store. They mean "could not decide".
var (
	ErrNoCaps       = errors.New("inflight: no caps")
	ErrEmptyKey     = errors.New("inflight: empty key")
	ErrDuplicateKey = errors.New("inflight: a key given twice")
	ErrInvalidLimit = errors.New("inflight: limit must be >= 1")
	ErrInvalidHold  = errors.New("inflight: hold must be > 0")
	// ErrCrossSlot means the keys of one Acquire hash to different Redis Cluster slots, which
	// one script cannot touch: put the same {hash-tag} in each of them.
	ErrCrossSlot = errors.New("inflight: keys in different Redis Cluster hash slots; give every key of one Acquire the same {hash-tag}")
	// ErrClosed is returned by Wait on a Redis store after Close.
	ErrClosed = errors.New("inflight: store closed")
)

// check validates an Acquire's input.
func check(caps []Cap, hold time.Duration) error {
	if len(caps) == 0 {
		return ErrNoCaps
	}
	if hold <= 0 {
		return ErrInvalidHold
	}
	for i, c := range caps {
		switch {
		case c.Key == "":
			return fmt.Errorf("cap %d: %w", i, ErrEmptyKey)
		case c.Limit < 1:
			return fmt.Errorf("cap %d %.64q: %w", i, c.Key, ErrInvalidLimit)
		}
		for _, d := range caps[:i] {
			if d.Key == c.Key {
				return fmt.Errorf("cap %d %.64q: %w", i, c.Key, ErrDuplicateKey)
			}
		}
	}
	return nil
}

// keysOf returns the keys of caps.
func keysOf(caps []Cap) []string {
	keys := make([]string, len(caps))
	for i, c := range caps {
		keys[i] = c.Key
	}
	return keys
}

// wrap prefixes err with the operation that failed.
func wrap(op string, err error) error { return fmt.Errorf("inflight: %s: %w", op, err) }
