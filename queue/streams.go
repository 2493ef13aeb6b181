package queue

import (
	"context"
	"fmt"
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
	if err != nil || !backlogs {
		return out, err
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
