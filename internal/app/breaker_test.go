package app

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/queue"
	"github.com/sluice-rl/sluice/retry/retrytest"
)

// The breaker's steps over a fake clock: a publish that JetStream does not answer takes the
// queue down; its publishes fail at once but for trials 250ms, 500ms, 1s, … apart (up to 5s);
// a refusal is no outage; an answered trial, or a reconnection, ends it.
func TestBreakerSteps(t *testing.T) {
	timeout := errors.New("nats: timeout")
	full := fmt.Errorf("%w: queue %q", queue.ErrFull, "orders")
	type step struct {
		advance   time.Duration
		reconnect bool
		err       error // the publish's, when admitted
		admitted  bool  // want: let through
		trial     bool  // want: as a trial
		down      bool  // want: isDown after the step
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"a refusal is an answer", []step{
			{err: full, admitted: true},
			{admitted: true},
		}},
		{"trials double", []step{
			{err: timeout, admitted: true, down: true},
			{advance: 249 * time.Millisecond, down: true},
			{advance: time.Millisecond, err: timeout, admitted: true, trial: true, down: true},
			{advance: 499 * time.Millisecond, down: true},
			{advance: time.Millisecond, err: timeout, admitted: true, trial: true, down: true},
			{advance: 999 * time.Millisecond, down: true},
			{advance: time.Millisecond, err: full, admitted: true, trial: true},
			{admitted: true},
		}},
		{"trials capped at 5s", []step{
			{err: timeout, admitted: true, down: true},
			{advance: 250 * time.Millisecond, err: timeout, admitted: true, trial: true, down: true},
			{advance: 500 * time.Millisecond, err: timeout, admitted: true, trial: true, down: true},
			{advance: time.Second, err: timeout, admitted: true, trial: true, down: true},
			{advance: 2 * time.Second, err: timeout, admitted: true, trial: true, down: true},
			{advance: 4 * time.Second, err: timeout, admitted: true, trial: true, down: true},
			{advance: 4999 * time.Millisecond, down: true},
			{advance: time.Millisecond, admitted: true, trial: true},
		}},
		{"a reconnection ends the outage", []step{
			{err: timeout, admitted: true, down: true},
			{advance: 10 * time.Millisecond, down: true},
			{reconnect: true, admitted: true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := retrytest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			b := newBreaker(clock, slog.New(slog.NewTextHandler(io.Discard, nil)))
			var reconnects uint64
			b.reconnects = func() uint64 { return reconnects }
			for i, s := range tc.steps {
				clock.Advance(s.advance)
				if s.reconnect {
					reconnects++
				}
				trial, err := b.admit("orders")
				if admitted := err == nil; admitted != s.admitted || trial != s.trial {
					t.Fatalf("step %d: admit = trial %v, err %v; want admitted %v, trial %v", i, trial, err, s.admitted, s.trial)
				}
				if err != nil && !errors.Is(err, errQueuesUnavailable) {
					t.Fatalf("step %d: refused with %v; want errQueuesUnavailable", i, err)
				}
				if err == nil {
					b.settle("orders", trial, s.err)
				}
				if got := b.isDown("orders"); got != s.down {
					t.Fatalf("step %d: isDown = %v; want %v", i, got, s.down)
				}
				if err := b.ready(); (err != nil) != s.down {
					t.Fatalf("step %d: ready = %v; want an error: %v", i, err, s.down)
				}
				if b.isDown("other") {
					t.Fatalf("step %d: another queue is down", i)
				}
			}
		})
	}
}

// TestBreakerLogsAnOutageTwice: an outage is one line when it begins and one when it ends, with
// the count of publishes answered 503 in between (the one that began it, the refusals, the
// failed trial), however many there were.
func TestBreakerLogsAnOutageTwice(t *testing.T) {
	clock := retrytest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var buf bytes.Buffer
	b := newBreaker(clock, slog.New(slog.NewTextHandler(&buf, nil)))
	timeout := errors.New("nats: timeout")
	b.settle("orders", false, timeout) // begins it: 1
	refuse := func(n int) {
		for range n {
			if _, err := b.admit("orders"); err == nil {
				t.Fatal("a publish let through between trials")
			}
		}
	}
	refuse(5)
	clock.Advance(250 * time.Millisecond)
	if trial, err := b.admit("orders"); err != nil || !trial {
		t.Fatal("no trial after 250 ms")
	}
	b.settle("orders", true, timeout) // a failed trial: 7
	refuse(3)
	clock.Advance(500 * time.Millisecond)
	if trial, err := b.admit("orders"); err != nil || !trial {
		t.Fatal("no trial after 500 ms more")
	}
	b.settle("orders", true, nil)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[1], "answered_503=10") ||
		!strings.Contains(lines[1], "down_for=750ms") {
		t.Fatalf("the outage logged:\n%s", buf.String())
	}
}
