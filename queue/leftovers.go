package queue

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Leftovers are jobs that have left their queue but whose messages are still in its stream.
// A work-queue stream removes a job's message when the consumer takes its ack; when the
// stream cannot write at that moment — its store failed to write ("no space left on device":
// nats-server then keeps the stream's write error until it is restarted) — the consumer
// records the ack and the message stays. nats-server does not remove it after its restart
// either. No worker is given such a message again (it is at or below the consumer's ack
// floor), but the stream's message count, which is the queue's depth, would count it forever.
//
// Every message at or below the ack floor of the queue's consumer was acked or terminated by
// a worker: none is waiting. A stream whose first message is at or below that floor holds
// leftovers, and one purge up to the floor removes them all. Info does it when it finds them
// (its depth is then read again), and RemoveLeftovers does it on its own; their tickets were
// released when the acks were answered (and SweepLedger repairs those that were not).
//
// Cost: nothing beyond the stream and consumer reads Info makes anyway; RemoveLeftovers
// makes those two reads per call, and a purge and a stream read only when it finds leftovers.

// hasLeftovers reports whether a stream in state s holds messages at or below ackFloor, the
// stream sequence of its consumer's ack floor. A floor beyond the stream's last sequence (a
// stream that lost messages it had acknowledged, behind a consumer that kept its state) is
// not trusted.
func hasLeftovers(s jetstream.StreamState, ackFloor uint64) bool {
	return s.Msgs > 0 && s.FirstSeq <= ackFloor && ackFloor <= s.LastSeq
}

// purgeLeftovers removes the messages of st at or below ackFloor.
func purgeLeftovers(ctx context.Context, st jetstream.Stream, ackFloor uint64) error {
	return st.Purge(ctx, jetstream.WithPurgeSequence(ackFloor+1))
}

// RemoveLeftovers removes queue name's leftovers (see above): the messages still in its
// stream of jobs its consumer saw acknowledged. It returns how many it removed; an error when
// the stream or consumer cannot be read, or the purge fails (the stream still cannot write:
// nats-server has not been restarted since its store failed).
func (d Deliveries) RemoveLeftovers(ctx context.Context, name string) (int, error) {
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	st, ok := d.stream(name)
	if !ok {
		return 0, fmt.Errorf("%w: %q", ErrUnknownQueue, name)
	}
	si, err := st.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("queue: leftovers of %q: %w", name, err)
	}
	c, err := st.Consumer(ctx, consumerName)
	if err != nil {
		return 0, fmt.Errorf("queue: leftovers of %q: consumer: %w", name, err)
	}
	ci, err := c.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("queue: leftovers of %q: consumer: %w", name, err)
	}
	if !hasLeftovers(si.State, ci.AckFloor.Stream) {
		return 0, nil
	}
	if err := purgeLeftovers(ctx, st, ci.AckFloor.Stream); err != nil {
		return 0, fmt.Errorf("queue: remove the leftovers of %q: %w", name, err)
	}
	after, err := st.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("queue: leftovers of %q: %w", name, err)
	}
	if after.State.Msgs >= si.State.Msgs {
		return 0, nil
	}
	return int(si.State.Msgs - after.State.Msgs), nil
}
