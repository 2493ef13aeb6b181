package worker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/queue"
	"github.com/sluice-rl/sluice/retry"
)

// dueMover moves a queue's scheduled jobs into it once their time comes (queue.Schedules).
type dueMover interface {
	MoveDue(ctx context.Context, name string, max int, wait time.Duration, cut context.Context) (int, error)
	// WatchSchedules calls fn with every queue that has a schedule stream, now and as they
	// are made, until ctx ends or the watch fails.
	WatchSchedules(ctx context.Context, fn func(queue string)) error
}

// moveBatch is how many due jobs one MoveDue call takes at most. It waits for the first up
// to idleWait (the call returns as soon as one is there), cut short as the runner's own long
// pulls are (idle.go): a queue with a schedule stream costs each worker a pull per idleWait.
const moveBatch = 256

// Schedule streams are made on demand, by a queue's first scheduled job (package queue): a
// runner moves its queue's due jobs only once the pool knows that its queue has one, so a
// queue that never had a scheduled job costs its workers no mover pulls. The pool learns it
// from one watch per process (watchSchedules): a stream listing at start, then JetStream's
// advisory that a mover was created, and a new listing after every reconnection (an advisory
// sent while the connection was down is lost), so a stream made while the worker runs has
// its mover at once.

// schedules is the set of queues the pool knows to have a schedule stream. The zero value is
// empty and ready; it is safe for concurrent use.
type schedules struct {
	mu      sync.Mutex
	has     map[string]bool
	waiting map[string]chan struct{} // closed when the queue is added
}

// add records that queue name has a schedule stream.
func (s *schedules) add(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.has[name] {
		return
	}
	if s.has == nil {
		s.has = map[string]bool{}
	}
	s.has[name] = true
	if ch, ok := s.waiting[name]; ok {
		close(ch)
		delete(s.waiting, name)
	}
}

// known reports whether queue name has a schedule stream.
func (s *schedules) known(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.has[name]
}

// wait returns true once queue name has a schedule stream, false if ctx ends first.
func (s *schedules) wait(ctx context.Context, name string) bool {
	s.mu.Lock()
	if s.has[name] {
		s.mu.Unlock()
		return true
	}
	if s.waiting == nil {
		s.waiting = map[string]chan struct{}{}
	}
	ch, ok := s.waiting[name]
	if !ok {
		ch = make(chan struct{})
		s.waiting[name] = ch
	}
	s.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}

// watchSchedules keeps p.schedules up to date until ctx ends: it watches again (listing the
// streams again) whenever the waiting pulls are cut short — on a reconnection to NATS or a
// consumer leader election — and after a failed watch.
func (p *Pool) watchSchedules(ctx context.Context) {
	mv := p.q
	for ctx.Err() == nil {
		cut := p.pulls.current()
		wctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(cut, cancel)
		err := mv.WatchSchedules(wctx, func(name string) {
			p.schedules.add(name)
			p.ring(name) // a shared queue's runner moves its due jobs: it starts now
		})
		stop()
		cancel()
		if err != nil && ctx.Err() == nil {
			p.log.Warn("worker: watching schedule streams; retrying", "err", err)
			retry.Sleep(ctx, nil, watchRetry)
		}
	}
}

// mover is the policy that moves its queue's due scheduled jobs into the queue while the
// queue runs, once the queue has a schedule stream (run). Every worker process runs one per
// queue with one; they share the schedule stream's one consumer.
type mover struct {
	env       queueEnv
	mv        dueMover
	schedules *schedules
	// cut returns the context that ends when waiting pulls must be made anew (Pool.pulls).
	cut func() context.Context
}

func (m *mover) run(ctx context.Context) {
	if m.mv == nil || !m.schedules.wait(ctx, m.env.name) {
		return
	}
	b := fetchBackoff.Backoff(nil)
	failures := 0
	for ctx.Err() == nil {
		if _, err := m.mv.MoveDue(ctx, m.env.name, moveBatch, idleWait, m.cut()); err != nil {
			failures++
			// The mover is made just after its stream: a watch that listed the stream in
			// between finds no mover for a moment.
			if failures == 1 && !errors.Is(err, queue.ErrNoSchedule) {
				m.env.log.Warn("worker: move due scheduled jobs", "queue", m.env.name, "err", err)
			}
			_ = b.Wait(ctx, 0)
			continue
		}
		failures = 0
		b.Reset()
	}
}
