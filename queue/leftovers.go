package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Leftovers are jobs that have left their queue but whose messages are still in its stream,
// where they count in the queue's depth (the stream's message count). Two faults leave them:
//
//   - Acked leftovers. A work-queue stream removes a job's message when the consumer takes
//     its ack; when the stream cannot write at that moment — its store failed to write ("no
//     space left on device": nats-server keeps the stream's write error until it is
//     restarted) — the consumer records the ack and the message stays. nats-server does not
//     remove it after its restart either, and no worker is given it again: it would count
//     forever. Every message at or below the consumer's ack floor was acked or terminated,
//     so a stream whose first message is at or below that floor holds such leftovers, and
//     one purge up to the floor removes them all. Their tickets were released when the acks
//     were answered (SweepLedger repairs those that were not).
//   - Final leftovers. A worker records a job's final status, then acks it; a worker that
//     crashed in between (or whose ack was lost with its connection) leaves the job in
//     flight until its AckWait runs out, when another worker is given it and acks it
//     without delivering. Such a job is delivered and not acked (between the consumer's ack
//     floor and its last delivery), its record is final and was written after the message
//     was stored (an older final record is a replayed dead letter's), at least
//     leftoverSettle ago (a live worker acks at once). Each is deleted and its tickets
//     released.
//
// Info purges acked leftovers when it finds them (its depth is then read again), and while
// the stream cannot remove them (its write error) does not count them; RemoveLeftovers
// removes both kinds. A job of a priority level's stream or a fair queue's
// backlog is not looked at.
//
// Cost: nothing beyond the stream and consumer reads Info makes anyway; RemoveLeftovers makes
// those two reads, a purge and a stream read only when it finds acked leftovers, and per job
// delivered but not acked (up to its limit) a message read, body included, and a status read.

// leftoverSettle is how old a final record must be for its job, still delivered and not
// acked, to be a leftover: far more than a live worker takes from the record to the ack.
const leftoverSettle = 5 * time.Second

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

// countLeftovers counts the messages of st at or below ackFloor, for a stream that cannot
// remove them yet: one stream read listing its deleted sequences (as many as the stream has
// gaps), made only then. ok is false when it cannot be read.
func countLeftovers(ctx context.Context, st jetstream.Stream, ackFloor uint64) (n uint64, ok bool) {
	si, err := st.Info(ctx, jetstream.WithDeletedDetails(true))
	if err != nil || !hasLeftovers(si.State, ackFloor) {
		return 0, err == nil
	}
	n = ackFloor - si.State.FirstSeq + 1
	for _, seq := range si.State.Deleted {
		if seq >= si.State.FirstSeq && seq <= ackFloor && n > 0 {
			n--
		}
	}
	return min(n, si.State.Msgs), true
}

// RemoveLeftovers removes queue name's leftovers (see above): the acked ones, and the final
// ones among up to limit jobs delivered and not acked, from stream sequence from on (0: from
// the first). It returns how many it removed, and where the next call should start (0: from
// the first again, all were looked at). It fails when the stream or consumer cannot be read,
// or the purge fails (the stream still cannot write: nats-server has not been restarted since
// its store failed).
func (d Deliveries) RemoveLeftovers(ctx context.Context, name string, from uint64, limit int) (removed int, next uint64, err error) {
	if _, shared := d.sharedIndex(name); shared {
		// A queue of a shared stream: RemoveSharedLeftovers, one pass over the shared streams
		// rather than requests per queue (what shared streams save).
		return 0, 0, nil
	}
	ctx, cancel := withDefaultTimeout(ctx, 4*opTimeout)
	defer cancel()
	st, ok := d.stream(name)
	if !ok {
		return 0, 0, fmt.Errorf("%w: %q", ErrUnknownQueue, name)
	}
	c, err := st.Consumer(ctx, consumerName)
	if err != nil {
		return 0, 0, fmt.Errorf("queue: leftovers of %q: consumer: %w", name, err)
	}
	ci, err := c.Info(ctx) // before the stream, as Info reads them
	if err != nil {
		return 0, 0, fmt.Errorf("queue: leftovers of %q: consumer: %w", name, err)
	}
	si, err := st.Info(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("queue: leftovers of %q: %w", name, err)
	}
	floor := ci.AckFloor.Stream
	if hasLeftovers(si.State, floor) {
		if err := purgeLeftovers(ctx, st, floor); err != nil {
			return 0, 0, fmt.Errorf("queue: remove the leftovers of %q: %w", name, err)
		}
		if after, err := st.Info(ctx); err == nil && after.State.Msgs < si.State.Msgs {
			removed = int(si.State.Msgs - after.State.Msgs)
		}
	}
	n, next, err := d.removeFinal(ctx, d.jobSubject(name, ""), st, max(from, floor+1), ci.Delivered.Stream, limit)
	if err != nil {
		return removed + n, 0, fmt.Errorf("queue: leftovers of %q: %w", name, err)
	}
	return removed + n, next, nil
}

// removeFinal deletes the final leftovers among up to limit jobs of a queue in stream st, its
// jobs' subjects prefix followed by their id, from sequence from to delivered, the
// consumer's last delivery. It returns how many it deleted and the sequence to go on from (0:
// it reached delivered).
func (q *core) removeFinal(ctx context.Context, prefix string, st jetstream.Stream, from, delivered uint64, limit int) (int, uint64, error) {
	removed, seq := 0, from
	for range max(limit, 1) {
		if seq > delivered {
			return removed, 0, nil
		}
		raw, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(prefix+"*"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return removed, 0, nil
		}
		if err != nil {
			return removed, 0, err
		}
		if raw.Sequence > delivered {
			return removed, 0, nil
		}
		seq = raw.Sequence + 1
		rec, err := Publisher{q}.Record(ctx, strings.TrimPrefix(raw.Subject, prefix))
		if errors.Is(err, ErrNotFound) {
			continue // no record yet: its first delivery is in flight
		}
		if err != nil {
			return removed, 0, err
		}
		if !rec.State.Terminal() || !rec.UpdatedAt.After(raw.Time) || q.now().Sub(rec.UpdatedAt) < leftoverSettle {
			continue
		}
		if err := st.DeleteMsg(ctx, raw.Sequence); err != nil {
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue // acked in the meantime
			}
			return removed, 0, err
		}
		q.releaseMsg(ctx, raw.Header)
		removed++
	}
	if seq > delivered {
		seq = 0
	}
	return removed, seq, nil
}
