package queue

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Releases by acknowledgement, gathered.
//
// Model. A job's held tickets (hold.go) are not released on the spot: releaseAcked queues
// them, and at the next instant of the wall clock that is a multiple of releaseTick the
// releaser publishes every queued release at once, each the hold consumer's acknowledgement of
// its ticket with a reply subject of its own under one inbox of the process
// (<inbox>.<token>); one subscription to <inbox>.* takes the answers. A release unanswered
// within holdWait of its publish falls back to deletion, as before.
//
// Why. A release sent on its own, as a request per ticket, cost its worker a goroutine, a
// timer, a flush of the connection and a wake-up for the answer, per job; at a throttled rate
// the answer found the process idle and woke it (docs/design/worker-costs.md). releaseTick is
// the worker's apply tick: a paced queue's status writes go at the same instants, so the
// releases of the jobs acked after the last tick go out with the next tick's writes, in one
// flush, and their answers come back with the writes' in the same reads.
//
// Guarantees. Unchanged but for time: a ticket still leaves only after its job's
// acknowledgement (a release is queued only after the ack), and only once (an acknowledgement
// names one stream sequence); the release is at most releaseTick later than it was, which
// errs toward refusing (the ticket counts against the bound meanwhile). Close waits for every
// queued release to be answered or to fall back.
//
// Costs. Per tick with releases: one timer expiry, one flush; per reply batch: one wake of the
// subscription's goroutine. Memory: one entry per release in flight.

// releaseTick is the period of the releases' instants; the worker's applyTick.
const releaseTick = 10 * time.Millisecond

// releaser gathers the releases by acknowledgement of a process.
type releaser struct {
	q      *core
	mu     sync.Mutex
	queued []ticket           // waiting for the next tick
	sent   map[uint64]release // in flight, by token
	token  uint64             // the last token given
	inbox  string             // the answers' subjects are inbox + "." + token
	sub    *nats.Subscription // to inbox + ".*", made at the first release
	timer  *time.Timer        // the next flush, while anything is queued or in flight
	at     time.Time          // when timer fires; zero: not armed
	// flushes counts the ticks that published releases (tests: releases share flushes).
	flushes int
}

// release is a release in flight: its ticket and when it was published.
type release struct {
	t  ticket
	at time.Time
}

// enqueue queues held tickets ts for the next tick. Each counts in q.releases until it is
// answered or has fallen back.
func (r *releaser) enqueue(ts []ticket) {
	r.q.releases.Add(len(ts))
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sub == nil {
		r.inbox = r.q.nc.NewInbox()
		sub, err := r.q.nc.Subscribe(r.inbox+".*", r.answered)
		if err != nil {
			// Not subscribed: every release falls back to deletion after holdWait.
			r.inbox = ""
		} else {
			_ = sub.SetPendingLimits(-1, -1) // an answer dropped would delete its ticket again
			r.sub = sub
		}
	}
	if r.sent == nil {
		r.sent = map[uint64]release{}
	}
	r.queued = append(r.queued, ts...)
	now := time.Now()
	tick := int64(releaseTick)
	r.arm(now.Add(time.Duration(tick - now.UnixNano()%tick)))
}

// arm makes the timer fire at t unless it fires sooner already. r.mu is held.
func (r *releaser) arm(t time.Time) {
	if !r.at.IsZero() && !r.at.After(t) {
		return
	}
	r.at = t
	if r.timer == nil {
		r.timer = time.AfterFunc(time.Until(t), r.flush)
		return
	}
	r.timer.Reset(time.Until(t))
}

// flush publishes the queued releases and falls back for those unanswered for holdWait.
func (r *releaser) flush() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.at = time.Time{}
	now := time.Now()
	if len(r.queued) > 0 {
		r.flushes++
	}
	for _, t := range r.queued {
		r.token++
		subject := "$JS.ACK." + t.stream + "." + holdName + ".1." + strconv.FormatUint(t.seq, 10) + ".0.0.0"
		if r.inbox == "" || r.q.nc.PublishRequest(subject, r.inbox+"."+strconv.FormatUint(r.token, 10), nil) != nil {
			// Not sent: it falls back at its deadline like one unanswered.
			r.sent[r.token] = release{t, now.Add(-r.q.holdWait)}
			continue
		}
		r.sent[r.token] = release{t, now}
	}
	clear(r.queued)
	r.queued = r.queued[:0]
	var late []ticket
	oldest := time.Time{}
	for k, s := range r.sent {
		if !now.Before(s.at.Add(r.q.holdWait)) {
			late = append(late, s.t)
			delete(r.sent, k)
			continue
		}
		if oldest.IsZero() || s.at.Before(oldest) {
			oldest = s.at
		}
	}
	if !oldest.IsZero() {
		r.arm(oldest.Add(r.q.holdWait))
	}
	if len(late) > 0 {
		r.q.releaseFallbacks.Add(uint64(len(late)))
		go func() {
			defer r.q.releases.Add(-len(late))
			ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
			defer cancel()
			r.q.release(ctx, late)
		}()
	}
}

// answered takes the server's answer to a release: the ticket is gone.
func (r *releaser) answered(m *nats.Msg) {
	_, tok, _ := strings.Cut(strings.TrimPrefix(m.Subject, r.inbox), ".")
	k, err := strconv.ParseUint(tok, 10, 64)
	if err != nil {
		return
	}
	r.mu.Lock()
	_, ok := r.sent[k]
	delete(r.sent, k)
	r.mu.Unlock()
	if ok {
		r.q.releases.Done()
	}
}

// stop unsubscribes from the answers; call it after q.releases has been waited for.
func (r *releaser) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sub != nil {
		_ = r.sub.Unsubscribe()
	}
	if r.timer != nil {
		r.timer.Stop()
	}
}

// flushCount is how many ticks published releases (tests).
func (r *releaser) flushCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.flushes
}
