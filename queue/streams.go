package queue

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Counts are the counters of one queue's stream that one stream listing carries: enough to
// chart a queue's depth and drain rate without a request per queue.
type Counts struct {
	// Depth is the number of jobs in the queue's stream (waiting and in flight); a fair
	// queue's backlogs are added when the listing includes them (see [Queues.Counts]).
	Depth uint64
	// Left is how many jobs have left the stream since it was created (LastSeq - Msgs); its
	// change over time is the drain rate.
	Left uint64
}

// Counts reads the counters of every queue stream of this Queues' prefix, whether this
// process provisioned it or not, with one paged stream listing (JetStream answers up to 256
// streams a request): its cost grows with the number of queues / 256, not with the number of
// queues. With backlogs true it lists the fair queues' backlog streams too (a second listing)
// and adds their messages to Depth.
func (q *Queues) Counts(ctx context.Context, backlogs bool) (map[string]Counts, error) {
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	out := map[string]Counts{}
	err := q.listStreams(ctx, q.opts.Prefix+".q.>", q.opts.Prefix+"_Q_", func(name string, s jetstream.StreamState) {
		c := Counts{Depth: s.Msgs}
		if s.LastSeq >= s.Msgs {
			c.Left = s.LastSeq - s.Msgs
		}
		out[name] = c
	})
	if err != nil {
		return out, err
	}
	// Shared streams, current and former (a queue's jobs may be in both while it moves); the
	// own streams' jobs hold tickets too.
	own := make(map[string]uint64, len(out))
	for name, c := range out {
		own[name] = c.Depth
	}
	shared, _, err := q.sharedScan(ctx, true, own)
	if err != nil {
		return out, err
	}
	for name, s := range shared {
		c := out[name]
		c.Depth, c.Left = c.Depth+s.Depth, c.Left+s.Left
		out[name] = c
	}
	if !backlogs {
		return out, nil
	}
	err = q.listStreams(ctx, q.opts.Prefix+".t.>", q.opts.Prefix+"_T_", func(name string, s jetstream.StreamState) {
		c := out[name]
		c.Depth += s.Msgs
		out[name] = c
	})
	return out, err
}

// listStreams calls f with the queue name and state of every stream whose subjects match
// subject and whose name starts with prefix.
func (q *core) listStreams(ctx context.Context, subject, prefix string, f func(string, jetstream.StreamState)) error {
	l := q.js.ListStreams(ctx, jetstream.WithStreamListSubject(subject))
	for si := range l.Info() {
		if name, ok := strings.CutPrefix(si.Config.Name, prefix); ok {
			f(name, si.State)
		}
	}
	if err := l.Err(); err != nil {
		return fmt.Errorf("queue: list streams: %w", err)
	}
	return nil
}

// Info describes queue name. It returns ErrUnknownQueue when name is not provisioned.
func (q *Queues) Info(ctx context.Context, name string) (Info, error) {
	s, ok := q.spec(name)
	if !ok {
		return Info{}, fmt.Errorf("%w: %q", ErrUnknownQueue, name)
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	info := Info{Name: name, MaxDepth: s.MaxDepth}
	if s.Fair {
		// The backlogs before the delivery stream: a job the scheduler moves in between is
		// counted twice (at most the scheduler's target of them), never missed.
		if err := q.fairInfo(ctx, name, &info); err != nil {
			return Info{}, err
		}
	}
	if _, shared := q.sharedIndex(name); shared {
		if err := q.sharedInfo(ctx, s, &info); err != nil {
			return Info{}, err
		}
		return info, q.infoParts(ctx, s, &info)
	}
	st, err := q.js.Stream(ctx, q.streamName(name))
	if err != nil {
		return Info{}, fmt.Errorf("queue: info %q: %w", name, err)
	}
	// The consumer first: an ack floor read before the stream is at most the stream's first
	// sequence less one, but for leftovers (a floor read after could pass jobs acked between).
	c, err := st.Consumer(ctx, consumerName)
	if err != nil {
		return Info{}, fmt.Errorf("queue: info %q: consumer: %w", name, err)
	}
	ci, err := c.Info(ctx)
	if err != nil {
		return Info{}, fmt.Errorf("queue: info %q: consumer: %w", name, err)
	}
	si, err := st.Info(ctx)
	if err != nil {
		return Info{}, fmt.Errorf("queue: info %q: %w", name, err)
	}
	// Jobs acked whose messages stayed (leftovers.go) are not waiting: removed, then not
	// counted; while the stream cannot remove them (its purge fails), counted and taken off.
	var leftovers uint64
	if floor := ci.AckFloor.Stream; hasLeftovers(si.State, floor) {
		if purgeLeftovers(ctx, st, floor) == nil {
			if after, err := st.Info(ctx); err == nil {
				si = after
			}
		} else if n, ok := countLeftovers(ctx, st, floor); ok {
			leftovers = n
		}
	}
	info.Depth, info.Bytes, info.Consumers = info.Depth+si.State.Msgs-leftovers, si.State.Bytes, si.State.Consumers
	if si.State.LastSeq >= si.State.Msgs {
		info.Left = si.State.LastSeq - si.State.Msgs
	}
	info.Pending, info.InFlight = ci.NumPending, ci.NumAckPending
	info.Redelivered, info.Waiting = ci.NumRedelivered, ci.NumWaiting
	if err := q.infoParts(ctx, s, &info); err != nil {
		return Info{}, err
	}
	return info, nil
}

// infoParts adds to info what queue s holds beside its jobs' stream: dead letters, scheduled
// jobs, priority levels.
func (q *Queues) infoParts(ctx context.Context, s Spec, info *Info) error {
	name := s.Name
	var err error
	if info.DeadLetters, err = q.deadLetterCount(ctx, name); err != nil {
		return fmt.Errorf("queue: info %q: dead letters: %w", name, err)
	}
	if info.Scheduled, err = q.scheduled(ctx, name); err != nil {
		return fmt.Errorf("queue: info %q: scheduled: %w", name, err)
	}
	if s.Priorities && !s.Fair {
		levels, err := q.levelDepths(ctx, name)
		if err != nil {
			return fmt.Errorf("queue: info %q: priorities: %w", name, err)
		}
		info.Depth += levels
	}
	return nil
}

// List describes every provisioned queue, sorted by name.
func (q *Queues) List(ctx context.Context) ([]Info, error) {
	q.mu.RLock()
	names := make([]string, 0, len(q.specs))
	for n := range q.specs {
		names = append(names, n)
	}
	q.mu.RUnlock()
	slices.Sort(names)
	out := make([]Info, 0, len(names))
	for _, n := range names {
		info, err := q.Info(ctx, n)
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	return out, nil
}
