package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Former streams: migration between a queue's own stream and the shared streams. A queue's
// jobs move to another stream when Options.SharedStreams is turned on or off or changes, or
// when the queue becomes shareable or stops being so (fair, priorities, max_bytes): its new
// jobs go to its new stream, and those already stored wait where they were, in its former
// stream:
//
//   - its own stream, "<prefix>_Q_<queue>" (consumer "workers"), while it is a shared queue
//     now: found by Provision's listing of stream names, so known from a start or reload;
//   - a shared stream "<prefix>_J_<k>" other than its current one (another count, or it has a
//     stream of its own now), where its jobs are the subjects "<prefix>.j.<k>.<queue>.>" and
//     its consumer is the one named after it: found by the shared streams' scan (Waiting),
//     which lists the consumers of the shared streams that hold jobs, and their
//     subjects when consumers do not account for all of them.
//
// The workers drain a queue's former streams through the queue's runner, before its current
// stream, under the same policies (the same leak slots: the queue's one global rate), each
// job acknowledged in the stream it came from: nothing moves between streams, so nothing is
// stored twice. Once a former stream holds none of the queue's jobs, RetireFormer removes it:
//
//   - a queue's own former stream: its subjects are first changed to "<prefix>.x.<stream>",
//     so that a publish of a process still on the old configuration fails (the client gets a
//     503) rather than store a job in a stream about to go; then, once it holds no message,
//     it is deleted;
//   - a queue's consumer on a former shared stream: paused, read (no job waiting or
//     unacknowledged), deleted, or resumed when a job came. A job stored after the deletion
//     waits with no consumer until the next scan finds its subject; the shared stream itself
//     stays (other queues' jobs may be in it; one that no count uses any more is left empty).
//
// Order: each stream delivers in its own order, as before; between a queue's former and
// current streams there is none, but a worker that knows the former stream takes its jobs
// first, so jobs stored before the switch mostly go before those stored after it.

// FormersPossible reports whether a queue may have a former stream to drain first: whether
// the last Provision's listing of the streams found a shared stream (a queue that is shared,
// or was, has its jobs in one). Without one no queue has a former stream (an own stream is
// only a former one of a shared queue), and a worker's runners need not wait for the first
// sweep, which looks for them, before their first fetch. A shared stream made after that
// listing, by a process with another shared_streams during a rolling restart, is found by the
// sweeps as before (docs/design/scale.md, "Former streams").
func (d Deliveries) FormersPossible() bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.sharedSeen
}

// ownFormers returns the queues' own former streams of the last Provision, by queue.
func (q *core) ownFormers(into map[string][]string) {
	q.mu.RLock()
	defer q.mu.RUnlock()
	for name := range q.formerOwn {
		into[name] = append(into[name], q.opts.Prefix+"_Q_"+name)
	}
}

// formerOf reports whether stream (a shared stream's index, as text) is a former stream of
// provisioned queue name: name is not shared now or shared in another stream.
func (q *core) formerOf(name, stream string) bool {
	if _, ok := q.spec(name); !ok {
		return false
	}
	k, shared := q.sharedIndex(name)
	return !shared || strconv.Itoa(k) != stream
}

// FormerConsumer returns the consumer of queue name on its former stream: "workers" on its
// own stream, or, on a shared one, the consumer named after the queue, made when it is
// missing (jobs stored while it had none). It returns ErrUnknownQueue when name is not
// provisioned.
func (d Deliveries) FormerConsumer(ctx context.Context, name, stream string) (*Consumer, error) {
	s, ok := d.spec(name)
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownQueue, name)
	}
	if err := d.subscribeHold(); err != nil {
		return nil, err
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	var (
		c   jetstream.Consumer
		err error
	)
	if k, shared := strings.CutPrefix(stream, d.opts.Prefix+"_J_"); shared {
		cfg := d.sharedConsumerConfig(s.withDefaults())
		cfg.FilterSubject = d.sharedRoot() + k + "." + name + ".>"
		c, err = d.ensureConsumer(ctx, stream, cfg)
	} else {
		c, err = d.js.Consumer(ctx, stream, consumerName)
	}
	if err != nil {
		return nil, fmt.Errorf("queue: consumer of %q on its former stream %s: %w", name, stream, err)
	}
	return newConsumer(d.core, name, c), nil
}

// RetireFormer removes queue name's former stream (see above) once it holds none of the
// queue's jobs, and reports whether it is gone. A former stream that still holds jobs, or
// got one meanwhile, is left (false, nil).
func (d Deliveries) RetireFormer(ctx context.Context, name, stream string) (bool, error) {
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	var (
		gone bool
		err  error
	)
	if k, shared := strings.CutPrefix(stream, d.opts.Prefix+"_J_"); shared {
		gone, err = d.retireSharedFormer(ctx, name, stream, k)
	} else {
		gone, err = d.retireOwnFormer(ctx, name, stream)
	}
	if err != nil {
		return false, fmt.Errorf("queue: retire the former stream %s of %q: %w", stream, name, err)
	}
	if gone {
		d.mu.Lock()
		if stream == d.opts.Prefix+"_Q_"+name {
			delete(d.formerOwn, name)
		}
		d.mu.Unlock()
	}
	return gone, nil
}

// formerPause is how long RetireFormer pauses a former consumer while it reads it.
const formerPause = 10 * time.Second

// retireSharedFormer deletes queue name's consumer on shared stream k (named stream) when it
// holds no job: paused first, so that no job is delivered between the read and the deletion
// (an acknowledgement after the deletion would be lost, and the job delivered again).
func (q *core) retireSharedFormer(ctx context.Context, name, stream, k string) (bool, error) {
	_, err := q.js.PauseConsumer(ctx, stream, name, q.now().Add(formerPause))
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		// No consumer: gone when none of its subjects holds a job.
		st, err := q.js.Stream(ctx, stream)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		si, err := st.Info(ctx, jetstream.WithSubjectFilter(q.sharedRoot()+k+"."+name+".>"))
		if err != nil {
			return false, err
		}
		return len(si.State.Subjects) == 0, nil
	}
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	c, err := q.js.Consumer(ctx, stream, name)
	if err == nil {
		if ci := c.CachedInfo(); ci.NumPending == 0 && ci.NumAckPending == 0 {
			if err := q.js.DeleteConsumer(ctx, stream, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return false, err
			}
			return true, nil
		}
	}
	if _, rerr := q.js.ResumeConsumer(ctx, stream, name); rerr != nil && err == nil {
		err = rerr
	}
	return false, err
}

// retireOwnFormer deletes queue name's own former stream once it holds no message (or only
// acked leftovers, purged first), its subjects changed first so that nothing is stored in it
// any more.
func (q *core) retireOwnFormer(ctx context.Context, name, stream string) (bool, error) {
	st, err := q.js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	if state := st.CachedInfo().State; state.Msgs > 0 {
		// Only acked leftovers (leftovers.go) — none waiting, none unacknowledged — do not
		// keep it: they are purged.
		c, err := st.Consumer(ctx, consumerName)
		if err != nil {
			return false, err
		}
		ci := c.CachedInfo()
		if ci.NumPending > 0 || ci.NumAckPending > 0 || !hasLeftovers(state, ci.AckFloor.Stream) {
			return false, nil
		}
		if err := purgeLeftovers(ctx, st, ci.AckFloor.Stream); err != nil {
			return false, err
		}
		if si, err := st.Info(ctx); err != nil || si.State.Msgs > 0 {
			return false, err
		}
	}
	cfg := st.CachedInfo().Config
	if retired := []string{q.opts.Prefix + ".x." + stream}; !slices.Equal(cfg.Subjects, retired) {
		cfg.Subjects = retired
		if _, err := q.js.UpdateStream(ctx, cfg); err != nil {
			return false, err
		}
	}
	// Read again: a job may have been stored before the subjects changed.
	si, err := st.Info(ctx)
	if err != nil {
		return false, err
	}
	if si.State.Msgs > 0 {
		return false, nil
	}
	if err := q.js.DeleteStream(ctx, stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return false, err
	}
	return true, nil
}

// formerSnap is the former streams a scan found (sharedScan), by queue, and when.
type formerSnap struct {
	at time.Time
	m  map[string][]string
}

// formerStale is how old the last scan's former streams may be for a status read or a
// cancel that looks for a job there: older, the reader scans again (one at a time).
const formerStale = 5 * time.Second

// formerStreams returns queue name's former streams as the last scan found them, scanning
// again when that is older than formerStale: a process that does not sweep (the ingress)
// scans only when a job is not found where its queue keeps it now, at most once per
// formerStale.
func (q *core) formerStreams(ctx context.Context, name string) []string {
	snap := q.formerSeen.Load()
	if (snap == nil || q.now().Sub(snap.at) > formerStale) && q.scanning.TryLock() {
		_, _, _ = q.sharedScan(ctx, false, nil) // stores what it found
		q.scanning.Unlock()
		snap = q.formerSeen.Load()
	}
	if snap == nil {
		return nil
	}
	return snap.m[name]
}

// formerSubject is the subject of job id of queue name in its former stream.
func (q *core) formerSubject(stream, name, id string) string {
	if k, shared := strings.CutPrefix(stream, q.opts.Prefix+"_J_"); shared {
		return q.sharedRoot() + k + "." + name + "." + id
	}
	return q.opts.Prefix + ".q." + name + "." + id
}

// findFormer returns the message of job id of queue name in one of its former streams, and
// that stream; ok is false when none holds it.
func (q *core) findFormer(ctx context.Context, name, id string) (jetstream.Stream, *jetstream.RawStreamMsg, bool) {
	for _, stream := range q.formerStreams(ctx, name) {
		st, err := q.js.Stream(ctx, stream)
		if err != nil {
			continue
		}
		if raw, err := st.GetLastMsgForSubject(ctx, q.formerSubject(stream, name, id)); err == nil {
			return st, raw, true
		}
	}
	return nil, nil, false
}
