package app

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/queue"
	"github.com/sluice-rl/sluice/retry"
)

// trialPolicy spaces the trials of a queue that is down: the first 250ms after the failure,
// then twice as far apart each time, up to 5s.
var trialPolicy = retry.Policy{Initial: 250 * time.Millisecond, Max: 5 * time.Second, Jitter: -1}

// breaker is the circuit breaker of the publishes to each queue. Once a publish to a queue
// failed without an answer from JetStream (its timeout, no responders: a stream leader being
// elected, a stream whose store failed to write), the queue is down, as a breaker is open:
// its publishes fail at once, but one at a time is let through as a trial, spaced by
// trialPolicy on the breaker's clock. A trial that JetStream answers, or a reconnection to
// NATS (a restarted server), ends the outage. A refusal JetStream answered (full, too large)
// is not an outage.
//
// Make one with newBreaker; set reconnects before its first use. Its methods are safe for
// concurrent use, and take no lock while no queue is down.
type breaker struct {
	clock      retry.Clock
	reconnects func() uint64 // the NATS connection's reconnections so far; nil: none
	log        *slog.Logger
	// fix is what ready says to do about a stream whose store failed to write (fixRestart,
	// or the embedded server's own recovery).
	fix string

	mu    sync.Mutex
	down  map[string]*outage // by queue
	ndown atomic.Int32       // len(down)
}

// outage is a queue whose JetStream stopped answering.
type outage struct {
	since      time.Time
	err        error  // the last unanswered publish's
	reconnects uint64 // the connection's reconnections when it began
	trial      bool   // a trial publish is in flight
	refused    int    // publishes answered 503 since it began: refused at once, or failed trials
	next       time.Time
	trials     *retry.Backoff // the waits between trials
}

// fixRestart is what an operator does about a stream of a nats-server outside the process
// whose store failed to write: nats-server keeps the error until JetStream starts again.
const fixRestart = "free space, then restart nats-server (or reload its config with jetstream disabled, " +
	"then again with it enabled): the stream keeps failing until JetStream starts again"

// newBreaker returns a breaker with no queue down, on clock c (nil: the system clock).
func newBreaker(c retry.Clock, log *slog.Logger) *breaker {
	if c == nil {
		c = retry.SystemClock
	}
	return &breaker{clock: c, log: log, down: map[string]*outage{}, fix: fixRestart}
}

// admit lets a publish to q through (trial: as the trial of its outage), or returns the error
// that refuses it at once.
func (b *breaker) admit(q string) (trial bool, err error) {
	if b.ndown.Load() == 0 {
		return false, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	o := b.outage(q)
	if o == nil {
		return false, nil
	}
	if !o.trial && !b.clock.Now().Before(o.next) {
		o.trial = true
		return true, nil
	}
	o.refused++
	return false, fmt.Errorf("%w: JetStream has not answered for queue %q since %s: %v", errQueuesUnavailable, q,
		o.since.Format(time.RFC3339), o.err)
}

// settle records how a publish to q (trial: its outage's trial) ended.
func (b *breaker) settle(q string, trial bool, err error) {
	if err == nil && b.ndown.Load() == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	o := b.down[q]
	now := b.clock.Now()
	switch {
	case !unanswered(err):
		if o != nil && (trial || err == nil) {
			b.end(q)
			b.log.Info("ingress: JetStream answers for the queue again", "queue", q, "down_for", now.Sub(o.since).Round(time.Millisecond),
				"answered_503", o.refused)
		}
	case o == nil:
		o = &outage{since: now, err: err, trials: trialPolicy.Backoff(b.clock), refused: 1}
		if b.reconnects != nil {
			o.reconnects = b.reconnects()
		}
		o.next = now.Add(o.wait())
		b.down[q] = o
		b.ndown.Store(int32(len(b.down)))
		b.log.Warn("ingress: JetStream does not answer for the queue; its deferrals answer 503 at once, one at a time tried, until it does",
			"queue", q, "err", err)
	case trial:
		o.err, o.trial = err, false
		o.refused++
		o.next = now.Add(o.wait())
	}
}

// wait is the time from now to o's next trial.
func (o *outage) wait() time.Duration {
	d, _ := o.trials.Next(0) // never spent: trialPolicy has no bound
	return d
}

// isDown reports whether q is down.
func (b *breaker) isDown(q string) bool {
	if b.ndown.Load() == 0 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.outage(q) != nil
}

// outage returns q's outage, nil when it is not down or the connection reconnected since it
// began. b.mu is held.
func (b *breaker) outage(q string) *outage {
	o := b.down[q]
	if o != nil && b.reconnects != nil && b.reconnects() != o.reconnects {
		b.end(q)
		b.log.Info("ingress: reconnected to NATS; publishing to the queue again", "queue", q,
			"down_for", b.clock.Now().Sub(o.since).Round(time.Millisecond), "answered_503", o.refused)
		return nil
	}
	return o
}

// end ends q's outage. b.mu is held.
func (b *breaker) end(q string) {
	delete(b.down, q)
	b.ndown.Store(int32(len(b.down)))
}

// ready returns an error naming the queues that are down, nil when none is.
func (b *breaker) ready() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	names := make([]string, 0, len(b.down))
	for q := range b.down {
		if b.outage(q) != nil {
			names = append(names, q)
		}
	}
	if len(names) == 0 {
		return nil
	}
	sort.Strings(names)
	o := b.down[names[0]]
	return fmt.Errorf("JetStream does not answer for queue(s) %s since %s (%v): a stream leader "+
		"being elected, or a stream whose store failed to write (nats-server logs \"critical write "+
		"error\"; no space left on device): %s", strings.Join(names, ", "),
		o.since.Format(time.RFC3339), o.err, b.fix)
}

// unanswered reports whether a publish failed without an answer from JetStream (a refusal,
// such as a full queue, is an answer).
func unanswered(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case err == nil, errors.Is(err, queue.ErrFull), errors.Is(err, queue.ErrTenantFull), errors.Is(err, queue.ErrBudgetFull),
		errors.Is(err, queue.ErrUnknownQueue), errors.Is(err, queue.ErrTooLarge),
		errors.Is(err, queue.ErrIdempotencyMismatch):
		return false
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return true
	case errors.As(err, &apiErr):
		return false
	}
	return true
}
