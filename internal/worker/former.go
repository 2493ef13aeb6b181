package worker

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/sluice-rl/sluice/queue"
)

// Former streams (queue/former.go): a queue whose jobs moved to another stream — shared
// streams turned on or off, their count changed, the queue became fair or lost its
// max_bytes — still has jobs where they were. The sweep (shared.go) finds, every sweepEvery,
// the former streams of every queue, and the queue's runner drains them before its current
// stream: each fetch first asks the former streams for the jobs available now, and only when
// they have none, the current one. Their jobs go through the runner's policies like any
// other, so the queue keeps its one rate (its leak slots) across both streams, and each is
// acknowledged in the stream it came from. A former stream found empty is retired
// (queue.Deliveries.RetireFormer): at most once per formerRetry per runner, since a former
// stream whose last jobs are in other workers' hands answers "not yet".
//
// A shared queue's runner does not stop while its queue has former streams, and the sweep
// starts one for every queue that has them. A runner waiting in a long pull on its current
// stream is cut short when the sweep finds a former stream it did not know, so that the old
// jobs go first from then on.

// formerRetry is how often a runner tries to retire a former stream that it found empty;
// formerRetiring, how many retirements a pool makes at once.
const (
	formerRetry    = time.Second
	formerRetiring = 4
)

// formerSource is what the sweep and the runners need of the queue layer for former streams
// (queue.Deliveries).
type formerSource interface {
	FormerConsumer(ctx context.Context, name, stream string) (*queue.Consumer, error)
	RetireFormer(ctx context.Context, name, stream string) (bool, error)
}

// formersPossible reports whether a queue of the pool may have a former stream: unless the
// queue layer says that none can (queue.Deliveries.FormersPossible: no shared stream exists),
// a runner's first fetch waits for the first sweep, which finds them. On a deployment that
// never used shared streams a fresh worker's runners fetch at once instead of after a listing
// of the streams (docs/design/worker-costs.md, "A fresh worker's start").
func (p *Pool) formersPossible() bool {
	f, ok := p.bells.(interface{ FormersPossible() bool })
	return !ok || f.FormersPossible()
}

// formersOf returns the former streams of queue name that the last sweep found.
func (p *Pool) formersOf(name string) []string {
	if m := p.formers.Load(); m != nil {
		return (*m)[name]
	}
	return nil
}

// setFormers keeps the former streams a sweep found, and cuts short the long pull of each
// runner whose queue has one it did not have.
func (p *Pool) setFormers(m map[string][]string) {
	old := p.formers.Swap(&m)
	var grown []string
	for name, streams := range m {
		var before []string
		if old != nil {
			before = (*old)[name]
		}
		for _, st := range streams {
			if !slices.Contains(before, st) {
				grown = append(grown, name)
				p.log.Debug("worker: queue has jobs in a former stream; draining it first", "queue", name, "stream", st)
				break
			}
		}
	}
	if len(grown) > 0 {
		slices.Sort(grown)
		p.log.Info("worker: queues moved to other streams have jobs where they were; draining those first",
			"queues", len(grown), "first", quoteSome(grown, 5))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, name := range grown {
		if r := p.runners[name]; r != nil {
			r.cutPull()
		}
	}
}

// formerGone forgets queue name's former stream, retired.
func (p *Pool) formerGone(name, stream string) {
	for {
		old := p.formers.Load()
		if old == nil || !slices.Contains((*old)[name], stream) {
			return
		}
		m := maps.Clone(*old)
		m[name] = slices.DeleteFunc(slices.Clone(m[name]), func(s string) bool { return s == stream })
		if len(m[name]) == 0 {
			delete(m, name)
		}
		if p.formers.CompareAndSwap(old, &m) {
			p.log.Debug("worker: former stream drained and retired", "queue", name, "stream", stream)
			return
		}
	}
}

// formerState is a runner's handles of its queue's former streams, and when it may next try
// to retire each; only the fetch loop uses it.
type formerState struct {
	cons    map[string]consumer
	retryAt map[string]time.Time
}

// fromFormers returns up to n jobs available now in the queue's former streams, the first
// stream that has any; none when they have none (retiring those found empty) or the queue
// has no former stream.
func (r *runner) fromFormers(ctx context.Context, n int) []*queue.Msg {
	streams := r.p.formersOf(r.name)
	fs := &r.fs.formers
	if len(streams) == 0 {
		fs.cons, fs.retryAt = nil, nil
		return nil
	}
	src, ok := r.p.q.(formerSource)
	if !ok {
		return nil
	}
	if fs.cons == nil {
		fs.cons, fs.retryAt = map[string]consumer{}, map[string]time.Time{}
	}
	for _, stream := range streams {
		c := fs.cons[stream]
		if c == nil {
			qc, err := src.FormerConsumer(ctx, r.name, stream)
			if err == nil {
				c, fs.cons[stream] = qc, qc
			} else {
				r.p.log.Debug("worker: former stream's consumer", "queue", r.name, "stream", stream, "err", err)
			}
		}
		if c != nil {
			msgs, err := c.Fetch(context.WithoutCancel(ctx), n, 0)
			if len(msgs) > 0 {
				return msgs
			}
			if err != nil {
				delete(fs.cons, stream) // its consumer may be gone: look it up again next time
			}
		}
		// Empty, or gone (another worker retired it: its consumer or stream is not found).
		r.retireFormer(ctx, src, stream)
	}
	return nil
}

// retireFormer tries to retire the queue's former stream, at most once per formerRetry, and
// while fewer than formerRetiring retirements of the pool are under way: a stream's deletion
// is heavy work for nats-server, and thousands at once delay the fetches of the queues still
// draining past their deadline (their jobs then wait for their ack_wait).
func (r *runner) retireFormer(ctx context.Context, src formerSource, stream string) {
	fs := &r.fs.formers
	now := r.p.now()
	if !now.After(fs.retryAt[stream]) {
		return
	}
	fs.retryAt[stream] = now.Add(formerRetry)
	select {
	case r.p.retiring <- struct{}{}:
		defer func() { <-r.p.retiring }()
	default:
		return
	}
	gone, err := src.RetireFormer(ctx, r.name, stream)
	if err != nil {
		r.p.log.Warn("worker: retiring a drained former stream; retrying", "queue", r.name, "stream", stream, "err", err)
	}
	if gone {
		delete(fs.cons, stream)
		delete(fs.retryAt, stream)
		r.p.formerGone(r.name, stream)
	}
}

// cutPull cuts the runner's long pull short, if it waits in one.
func (r *runner) cutPull() {
	if f := r.pullCut.Load(); f != nil {
		(*f)()
	}
}
