package queue

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Priorities of a queue that is not fair: a job of priority high or low waits in a stream of
// its own, <prefix>_QH_<queue> or <prefix>_QL_<queue> (subjects <prefix>.qh.<queue>.<id>,
// <prefix>.ql.<queue>.<id>), with a "workers" consumer of its own; a normal job, the default,
// stays where every job was before, so the default path costs what it did. Workers take high
// jobs before normal ones before low ones, with a starvation guard of their own (package
// worker). A fair queue orders a tenant's jobs by priority in its backlog instead (fair.go,
// package queue/fair). docs/design/time.md has the design and what was rejected.

// Priority is where a job stands among the waiting jobs of its queue.
type Priority string

// The priorities; the zero value is PriorityNormal.
const (
	PriorityHigh   Priority = "high"
	PriorityNormal Priority = ""
	PriorityLow    Priority = "low"
)

// ParsePriority reads a Sluice-Priority value: "high", "normal" or "low".
func ParsePriority(s string) (Priority, bool) {
	switch s {
	case "high":
		return PriorityHigh, true
	case "normal":
		return PriorityNormal, true
	case "low":
		return PriorityLow, true
	}
	return "", false
}

// Priorities are the levels a worker fetches from, first to last.
var Priorities = []Priority{PriorityHigh, PriorityNormal, PriorityLow}

// levelToken is the stream-name and subject mark of priority p: "" for normal.
func levelToken(p Priority) string {
	switch p {
	case PriorityHigh:
		return "H"
	case PriorityLow:
		return "L"
	}
	return ""
}

// levelStreamName is the stream of queue's jobs of priority p.
func (q *core) levelStreamName(queue string, p Priority) string {
	if t := levelToken(p); t != "" {
		return q.opts.Prefix + "_Q" + t + "_" + queue
	}
	return q.streamName(queue)
}

// levelSubject is the subject of job id of queue with priority p.
func (q *core) levelSubject(queue string, p Priority, id string) string {
	switch p {
	case PriorityHigh:
		return q.opts.Prefix + ".qh." + queue + "." + id
	case PriorityLow:
		return q.opts.Prefix + ".ql." + queue + "." + id
	}
	return q.jobSubject(queue, id)
}

// provisionLevels creates or updates the high and low streams of queue s and their
// consumers, as the queue's own but for their subjects.
func (q *core) provisionLevels(ctx context.Context, s Spec, limit func(int64) int64) error {
	for _, p := range []Priority{PriorityHigh, PriorityLow} {
		name := q.levelStreamName(s.Name, p)
		_, err := q.ensureStream(ctx, jetstream.StreamConfig{
			Name:        name,
			Description: "Sluice queue " + s.Name + ", priority " + string(p),
			Subjects:    []string{q.levelSubject(s.Name, p, "*")},
			Retention:   jetstream.WorkQueuePolicy,
			Discard:     jetstream.DiscardNew,
			MaxMsgs:     limit(s.MaxDepth),
			MaxBytes:    limit(s.MaxBytes),
			Storage:     jetstream.FileStorage,
			Replicas:    s.Replicas,
			Duplicates:  s.StreamDuplicates,
		})
		if err != nil {
			return fmt.Errorf("queue: %q: stream %s: %w", s.Name, name, err)
		}
		_, err = q.ensureConsumer(ctx, name, jetstream.ConsumerConfig{
			Durable:       consumerName,
			Description:   "Sluice workers of queue " + s.Name + ", priority " + string(p),
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       s.AckWait,
			MaxDeliver:    -1,
			MaxAckPending: s.MaxAckPending,
			DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if err != nil {
			return fmt.Errorf("queue: %q: consumer %s of %s: %w", s.Name, consumerName, name, err)
		}
	}
	return nil
}

// LevelConsumer returns the shared consumer of queue name's jobs of priority p; for
// PriorityNormal, Consumer's. It returns ErrUnknownQueue when name is not provisioned.
func (d Deliveries) LevelConsumer(ctx context.Context, name string, p Priority) (*Consumer, error) {
	if p == PriorityNormal {
		return d.Consumer(ctx, name)
	}
	if _, ok := d.spec(name); !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownQueue, name)
	}
	if err := d.subscribeHold(); err != nil {
		return nil, err
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	c, err := d.js.Consumer(ctx, d.levelStreamName(name, p), consumerName)
	if err != nil {
		return nil, fmt.Errorf("queue: consumer of %q, priority %s: %w", name, p, err)
	}
	return newConsumer(d.core, name, c), nil
}

// levelDepths returns how many jobs wait (or are in flight) in queue name's high and low
// streams together.
func (q *core) levelDepths(ctx context.Context, name string) (uint64, error) {
	var n uint64
	for _, p := range []Priority{PriorityHigh, PriorityLow} {
		st, err := q.js.Stream(ctx, q.levelStreamName(name, p))
		if err != nil {
			return 0, err
		}
		n += st.CachedInfo().State.Msgs
	}
	return n, nil
}

// deleteWaiting deletes job id of queue from the stream it waits in, whichever priority, or
// from a former stream of the queue (former.go), if it is there: for Cancel.
func (q *core) deleteWaiting(ctx context.Context, queue, id string) {
	for _, p := range Priorities {
		st, err := q.js.Stream(ctx, q.levelStreamName(queue, p))
		if err != nil {
			continue
		}
		if raw, err := st.GetLastMsgForSubject(ctx, q.levelSubject(queue, p, id)); err == nil {
			if st.DeleteMsg(ctx, raw.Sequence) == nil { // a worker that holds it sees the status
				q.releaseMsg(ctx, raw.Header)
			}
			return
		}
	}
	if st, raw, ok := q.findFormer(ctx, queue, id); ok && st.DeleteMsg(ctx, raw.Sequence) == nil {
		q.releaseMsg(ctx, raw.Header)
	}
}
