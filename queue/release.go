package queue

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Releases by acknowledgement, answered on one subscription.
//
// Model. releaseAcked hands a job's held tickets (hold.go) to a short goroutine that publishes
// each ticket's release, the hold consumer's acknowledgement of the ticket, with a reply
// subject of its own under one inbox of the process (<inbox>.<token>), and ends. One
// subscription to <inbox>.* takes the answers and forgets their releases; a release unanswered
// within holdWait of its publish falls back to deletion, as before, found by one timer armed
// for the oldest release in flight.
//
// Why. A release was a request of its own (nats.Conn.Request), waited for by a goroutine per
// job: per job a response channel, an entry in the connection's response map, a timer, and a
// hand-off of the answer to that goroutine (docs/design/worker-costs.md). Now the answers of
// releases that arrive together are taken in one wake of the subscription's goroutine. Two
// variants were measured and dropped (runtime traces of a drain at 2 000/s): publishing the
// release from the goroutine that acked, right after the ack, and gathering the releases to
// the worker's 10 ms apply ticks both woke the connection's flusher more often (1.8–2.2 times
// per job against 1.4: the flusher, readied by the first publish, ran on the other processor
// before the second), which cost more than they saved.
//
// Guarantees. Unchanged: a ticket leaves only after its job's acknowledgement (a release is
// published after the ack, on the same connection), at most once by acknowledgement (it names
// one stream sequence), and a release that is not answered falls back to deletion. Close waits
// for every release to be answered or to fall back.
//
// Costs. Per release: a goroutine that publishes and ends, one map entry until its answer. Per
// batch of answers: one wake of the subscription's goroutine. One timer per process, reset at
// most once per holdWait while releases are in flight.

// releaser sends the releases by acknowledgement of a process and takes their answers.
type releaser struct {
	q     *core
	mu    sync.Mutex
	sent  map[uint64]release // in flight, by token
	token uint64             // the last token given
	inbox string             // the answers' subjects are inbox + "." + token
	sub   *nats.Subscription // to inbox + ".*", made at the first release
	timer *time.Timer        // the check for releases unanswered for holdWait
	armed bool               // timer is set
	// published counts the releases published (tests).
	published int
}

// release is a release in flight: its ticket, when it was last published, and whether that
// was its second try.
type release struct {
	t     ticket
	at    time.Time
	again bool
}

// send publishes the releases of held tickets ts, each counted in q.releases by the caller
// until it is answered or has fallen back.
func (r *releaser) send(ts []ticket) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sent == nil {
		r.sent = map[uint64]release{}
		r.inbox = r.q.nc.NewInbox()
		sub, err := r.q.nc.Subscribe(r.inbox+".*", r.answered)
		if err != nil {
			r.inbox = "" // not subscribed: every release falls back after holdWait
		} else {
			_ = sub.SetPendingLimits(-1, -1) // an answer dropped would delete its ticket too
			r.sub = sub
		}
	}
	now := time.Now()
	for _, t := range ts {
		r.token++
		r.sent[r.token] = release{t: t, at: now}
		r.publish(r.token, t)
	}
	if !r.armed {
		r.armed = true
		if r.timer == nil {
			r.timer = time.AfterFunc(r.q.holdWait, r.expire)
		} else {
			r.timer.Reset(r.q.holdWait)
		}
	}
}

// publish sends the release of ticket t under token k; r.mu is held.
func (r *releaser) publish(k uint64, t ticket) {
	if r.inbox == "" {
		return
	}
	subject := "$JS.ACK." + t.stream + "." + holdName + ".1." + strconv.FormatUint(t.seq, 10) + ".0.0.0"
	if r.q.nc.PublishRequest(subject, r.inbox+"."+strconv.FormatUint(k, 10), nil) == nil {
		r.published++
	}
}

// expire publishes once more each release unanswered for holdWait after its first try (a
// ticket stored while no process that consumes was subscribed is delivered to the hold when
// one subscribes, and a fair queue's job can be acked before that catch-up reached its
// ticket), falls back to deletion for those unanswered after their second, and sets the timer
// for the oldest of the others.
func (r *releaser) expire() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.armed = false
	now := time.Now()
	var late []ticket
	var oldest time.Time
	for k, s := range r.sent {
		if !now.Before(s.at.Add(r.q.holdWait)) {
			if !s.again && r.inbox != "" {
				s.at, s.again = now, true
				r.sent[k] = s
				r.publish(k, s.t)
			} else {
				late = append(late, s.t)
				delete(r.sent, k)
				continue
			}
		}
		if oldest.IsZero() || s.at.Before(oldest) {
			oldest = s.at
		}
	}
	if !oldest.IsZero() {
		r.armed = true
		r.timer.Reset(oldest.Add(r.q.holdWait).Sub(now))
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

// publishedCount is how many releases were published (tests).
func (r *releaser) publishedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.published
}
