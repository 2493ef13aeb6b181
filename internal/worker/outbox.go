package worker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/queue"
)

// The outbox keeps the status records a worker could not write (NATS down, a stream leader
// being elected) until it can. A record counts the attempts the upstream may have seen; lost,
// the job's next delivery would count from an older record and send a Sluice-Attempt the
// upstream saw already. So:
//   - a record whose write failed goes to the outbox, which writes it again every
//     outboxRetry, and at once when the connection to NATS comes back;
//   - this process's next delivery of the job reads the outbox before the record (recall);
//   - after a reconnection to NATS (a restarted server may hand every unacked job out again at
//     once, to any worker) no process delivers a first delivery until the job store answers
//     again and then for outboxGrace, in which every worker's outbox lands what it kept: the
//     other worker that takes the job reads it.
//
// The bound: a record whose write keeps failing beyond outboxGrace after the store answered
// again (a second outage) may still be missed by another worker. The outbox holds one record per job,
// the latest, and at most outboxMax; it is lost with the process.

// outboxRetry is how often the outbox writes what it keeps again.
const outboxRetry = 250 * time.Millisecond

// outboxGrace is how long after a reconnection to NATS first deliveries wait, for the outboxes.
const outboxGrace = time.Second

// outboxMax bounds the records kept; beyond it the oldest job's is dropped (and logged).
const outboxMax = 100_000

// A nil *outbox keeps nothing (the executor's unit tests).
type outbox struct {
	mu      sync.Mutex
	pending map[string]queue.Status // by job id: the latest record not written
	kick    chan struct{}
}

func newOutbox() *outbox {
	return &outbox{pending: map[string]queue.Status{}, kick: make(chan struct{}, 1)}
}

// keep keeps st to write later, unless a later record of the job is kept already.
func (o *outbox) keep(st queue.Status, log *slog.Logger) {
	if o == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if old, ok := o.pending[st.ID]; ok && old.UpdatedAt.After(st.UpdatedAt) {
		return
	}
	if _, ok := o.pending[st.ID]; !ok && len(o.pending) >= outboxMax {
		var oldest string
		for id, p := range o.pending {
			if oldest == "" || p.UpdatedAt.Before(o.pending[oldest].UpdatedAt) {
				oldest = id
			}
		}
		log.Warn("worker: status outbox full; dropping the oldest record kept", "job", oldest)
		delete(o.pending, oldest)
	}
	o.pending[st.ID] = st
}

// written forgets the kept record of a job once a record as recent has been written.
func (o *outbox) written(st queue.Status) {
	if o == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if old, ok := o.pending[st.ID]; ok && !old.UpdatedAt.After(st.UpdatedAt) {
		delete(o.pending, st.ID)
	}
}

// record returns the kept record of job id, if any.
func (o *outbox) record(id string) (queue.Status, bool) {
	if o == nil {
		return queue.Status{}, false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	st, ok := o.pending[id]
	return st, ok
}

// size is the number of records kept.
func (o *outbox) size() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.pending)
}

// wake asks run to try now (the connection came back).
func (o *outbox) wake() {
	if o == nil {
		return
	}
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// run writes the kept records to store every outboxRetry and when woken, until ctx ends.
func (o *outbox) run(ctx context.Context, store jobStore, log *slog.Logger) {
	t := time.NewTicker(outboxRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-o.kick:
		}
		o.flush(ctx, store, log)
	}
}

// flush writes every kept record once, in no order, and forgets those written; it stops at
// the first failure (the others would most likely fail alike) until the next try.
func (o *outbox) flush(ctx context.Context, store jobStore, log *slog.Logger) {
	o.mu.Lock()
	batch := make([]queue.Status, 0, len(o.pending))
	for _, st := range o.pending {
		batch = append(batch, st)
	}
	o.mu.Unlock()
	for i, st := range batch {
		wctx, cancel := context.WithTimeout(ctx, opTimeout)
		cur, err := store.Record(wctx, st.ID)
		switch {
		case err == nil && cur.UpdatedAt.After(st.UpdatedAt):
			// Another worker delivered the job since (this one's ack was lost): its record
			// is the truth.
		case err == nil || errors.Is(err, queue.ErrNotFound):
			err = store.SetStatus(wctx, st)
		}
		cancel()
		if err != nil && !errors.Is(err, queue.ErrNotFound) {
			return
		}
		o.written(st)
		if i == len(batch)-1 {
			log.Info("worker: status records kept during an outage written", "records", len(batch))
		}
	}
}
