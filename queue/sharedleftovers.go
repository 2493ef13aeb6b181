package queue

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Leftovers of shared queues (leftovers.go has the two kinds). In a shared stream a purge up
// to a consumer's ack floor would take the other queues' jobs, so each queue's are removed by
// its own subjects: the acked ones with a purge of the queue's subjects up to its consumer's
// ack floor, the final ones as for a stream of its own, from the queue's jobs between its
// consumer's ack floor and its last delivery. A pass lists the shared streams (one listing)
// and, of each that holds messages, its consumers (one paged listing); then only the queues
// that may hold leftovers cost requests: acked ones where the stream holds more messages than
// its consumers (and the jobs of queues without one) account for — a fault's trace, one read
// per consumer of that stream, and a purge where one is found — and final ones where a
// consumer has jobs delivered and not acked, as for a queue with a stream of its own. It
// covers the consumers of former streams too (former.go), and of queues no longer configured.

// RemoveSharedLeftovers removes the leftovers of every queue of the shared streams, current or
// former. from holds, by "<stream>/<queue>", where the last pass stopped in the queue's jobs
// delivered and not acked (each pass reads up to limit of them per queue), and is updated. It
// returns how many it removed, by queue, and the first error (the other queues are still
// looked at).
func (d Deliveries) RemoveSharedLeftovers(ctx context.Context, from map[string]uint64, limit int) (map[string]int, error) {
	ctx, cancel := withDefaultTimeout(ctx, 4*opTimeout)
	defer cancel()
	type held struct {
		k     string
		state jetstream.StreamState
	}
	var streams []held
	removed := map[string]int{}
	err := d.listStreams(ctx, d.sharedRoot()+">", d.opts.Prefix+"_J_", func(k string, s jetstream.StreamState) {
		if s.Msgs > 0 && s.Consumers > 0 {
			streams = append(streams, held{k, s})
		}
	})
	if err != nil {
		return removed, err
	}
	var errs []error
	for _, h := range streams {
		st, err := d.sharedStream(ctx, h.k)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var (
			cons    []*jetstream.ConsumerInfo
			counted uint64
		)
		l := st.ListConsumers(ctx)
		for ci := range l.Info() {
			cons = append(cons, ci)
			counted += ci.NumPending + uint64(ci.NumAckPending)
		}
		if err := l.Err(); err != nil {
			errs = append(errs, fmt.Errorf("queue: consumers of %s: %w", st.CachedInfo().Config.Name, err))
			continue
		}
		// More messages than the consumers account for: acked leftovers, or jobs of queues
		// without a consumer (which the purges below, by ack floor, do not touch).
		acked := counted < h.state.Msgs
		for _, ci := range cons {
			prefix := d.sharedRoot() + h.k + "." + ci.Name + "."
			floor := ci.AckFloor.Stream
			if acked && floor >= h.state.FirstSeq && floor <= h.state.LastSeq {
				n, err := purgeSubjectLeftovers(ctx, st, prefix, floor)
				removed[ci.Name] += n
				if err != nil {
					errs = append(errs, fmt.Errorf("queue: remove the leftovers of %q: %w", ci.Name, err))
				}
			}
			if ci.NumAckPending == 0 {
				continue
			}
			key := st.CachedInfo().Config.Name + "/" + ci.Name
			n, next, err := d.removeFinal(ctx, prefix, st, max(from[key], floor+1), ci.Delivered.Stream, limit)
			removed[ci.Name] += n
			from[key] = next
			if err != nil {
				errs = append(errs, fmt.Errorf("queue: leftovers of %q: %w", ci.Name, err))
			}
		}
	}
	for name, n := range removed {
		if n == 0 {
			delete(removed, name)
		}
	}
	return removed, errors.Join(errs...)
}

// purgeSubjectLeftovers removes the messages of st on the subjects prefix+"*" at or below
// floor, the ack floor of their consumer, if its first one is: a read of that message, and a
// purge with two counts of the subjects where one is found. It returns how many it removed.
func purgeSubjectLeftovers(ctx context.Context, st jetstream.Stream, prefix string, floor uint64) (int, error) {
	first, err := st.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(prefix+"*"))
	if errors.Is(err, jetstream.ErrMsgNotFound) || (err == nil && first.Sequence > floor) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	count := func() uint64 {
		si, err := st.Info(ctx, jetstream.WithSubjectFilter(prefix+"*"))
		if err != nil {
			return 0
		}
		var n uint64
		for _, c := range si.State.Subjects {
			n += c
		}
		return n
	}
	before := count()
	if err := st.Purge(ctx, jetstream.WithPurgeSubject(prefix+"*"), jetstream.WithPurgeSequence(floor+1)); err != nil {
		return 0, err
	}
	if after := count(); after < before {
		return int(before - after), nil
	}
	return 0, nil
}
