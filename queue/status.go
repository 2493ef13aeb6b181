package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// record is the value of a job's entry in the status bucket.
type record struct {
	Status
	// Fingerprint identifies the request of a job with an Idempotency-Key (see fingerprint).
	Fingerprint string `json:"fingerprint,omitempty"`
	// Tenant is the job's tenant (Status.Tenant, which JSON leaves out).
	Tenant string `json:"tenant,omitempty"`
	// Delivered is Status.Delivered, which JSON leaves out.
	Delivered uint64 `json:"delivered,omitempty"`
	// Held is Status.Held, which JSON leaves out.
	Held int `json:"held,omitempty"`
	// Retracted marks the canceled status of a job whose publish was answered as failed but
	// may have been stored (see Publisher.Publish): a retry with its Idempotency-Key is a new job.
	Retracted bool `json:"retracted,omitempty"`
	// BacklogSeq is where the job of a fair queue was stored in its tenant's backlog, so that
	// Cancel can remove it from there.
	BacklogSeq uint64 `json:"backlog_seq,omitempty"`
	// Priority is the job's priority when BacklogSeq is set and it is not normal: the level
	// of the tenant's backlog it was stored in, for Place.
	Priority Priority `json:"priority,omitempty"`
}

// getRecord reads the entry of job id, returning ErrNotFound when there is none.
func (q *core) getRecord(ctx context.Context, id string) (record, uint64, error) {
	if !validID(id) {
		return record{}, 0, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	e, err := q.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return record{}, 0, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return record{}, 0, err
	}
	var r record
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return record{}, 0, fmt.Errorf("queue: status %s: %w", id, err)
	}
	r.Status.Tenant, r.Status.Delivered, r.Status.Held, r.Status.BacklogSeq, r.Status.Priority = r.Tenant, r.Delivered, r.Held, r.BacklogSeq, r.Priority
	return r, e.Revision(), nil
}

// recordStatus is the Status of a job's record r as Record returns it: with the fields JSON
// leaves out of Status filled in, and a scheduled job whose time came queued.
func (q *core) recordStatus(r record) Status {
	st := r.Status
	st.Tenant, st.Delivered, st.Held, st.BacklogSeq, st.Priority = r.Tenant, r.Delivered, r.Held, r.BacklogSeq, r.Priority
	return q.asOfNow(st)
}

// asOfNow returns st with a scheduled job whose time came shown queued: it waits in the
// queue (or is being moved there).
func (q *core) asOfNow(st Status) Status {
	if st.State == StateScheduled && st.NotBefore != nil && !q.now().Before(*st.NotBefore) {
		st.State = StateQueued
	}
	return st
}

// Status returns the status of job id: its entry in the status bucket, or, while a job
// without one waits in its queue, queued. It reads the entry, then (when there is none and id
// carries the tag of a provisioned queue) the job's message in that queue's stream, then the
// entry once more: a worker records a job's outcome before it acks the job, so a job taken,
// finished and acked between the first two reads is found by the third. Reads only.
//
// It returns ErrNotFound for an id that was never published, whose job has left its queue and
// has no entry (the entry expired, Options.StatusTTL after its last update, or the worker's
// writes failed), or whose queue is not provisioned here.
func (p Publisher) Status(ctx context.Context, id string) (Status, error) {
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	r, _, err := p.getRecord(ctx, id)
	if errors.Is(err, ErrNotFound) {
		st, looked, werr := p.waiting(ctx, id)
		switch {
		case werr == nil:
			return st, nil
		case !errors.Is(werr, ErrNotFound):
			err = werr
		case looked:
			r, _, err = p.getRecord(ctx, id)
		}
	}
	if err != nil && !errors.Is(err, ErrNotFound) {
		return Status{}, fmt.Errorf("queue: status %s: %w", id, err)
	}
	return p.asOfNow(r.Status), err
}

// Record returns the status of job id as its entry in the status bucket says, and
// ErrNotFound when it has none: unlike Status, it does not look for the job in its queue. A
// worker, which holds the job's message, reads this: one round trip instead of two for a job
// without an entry.
func (p Publisher) Record(ctx context.Context, id string) (Status, error) {
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	ctx, stop := p.whileConnected(ctx)
	defer stop()
	r, _, err := p.getRecord(ctx, id)
	if err != nil {
		return Status{}, err
	}
	return p.recordStatus(r), nil
}

// waiting returns the status of job id from its message in its queue's stream: queued. It
// looks in every provisioned queue whose tag id carries (normally one; looked is false when
// there is none), and returns ErrNotFound when none of them holds the job.
func (q *core) waiting(ctx context.Context, id string) (st Status, looked bool, err error) {
	tag, ok := idTag(id)
	if !ok || !validID(id) {
		return Status{}, false, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	type candidate struct {
		name   string
		stream jetstream.Stream
	}
	var cands []candidate
	q.mu.RLock()
	for name, st := range q.streams {
		if queueTag(name) == tag {
			cands = append(cands, candidate{name, st})
		}
	}
	q.mu.RUnlock()
	for _, c := range cands {
		raw, err := c.stream.GetLastMsgForSubject(ctx, q.jobSubject(c.name, id))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return Status{}, true, err
		}
		job, err := decode(raw.Header, raw.Data)
		if err != nil || job.ID != id {
			continue // not a job of ours
		}
		return Status{ID: id, Queue: c.name, State: StateQueued, CreatedAt: job.CreatedAt,
			UpdatedAt: raw.Time.UTC(), Tenant: job.Tenant, Seq: raw.Sequence}, true, nil
	}
	// A queue that moved (former.go): the job may still wait where the queue kept it before.
	for _, c := range cands {
		if _, raw, ok := q.findFormer(ctx, c.name, id); ok {
			if job, err := decode(raw.Header, raw.Data); err == nil && job.ID == id {
				return Status{ID: id, Queue: c.name, State: StateQueued, CreatedAt: job.CreatedAt,
					UpdatedAt: raw.Time.UTC(), Tenant: job.Tenant, Seq: raw.Sequence}, true, nil
			}
		}
	}
	return Status{}, len(cands) > 0, fmt.Errorf("%w: %s", ErrNotFound, id)
}

// SetStatus records st as the status of job st.ID; workers call it as a job moves through its
// states. UpdatedAt defaults to now, and CreatedAt and Queue to the recorded ones (from the
// job's message in its queue when it has no entry yet). A job whose
// recorded state is succeeded keeps it: a late update from a worker whose delivery was
// duplicated (its ack wait expired) is ignored and SetStatus returns nil.
func (p Publisher) SetStatus(ctx context.Context, st Status) error {
	if !validID(st.ID) {
		return fmt.Errorf("queue: set status: invalid job id %q", st.ID)
	}
	if st.State == "" {
		return fmt.Errorf("queue: set status %s: empty state", st.ID)
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	// A write in flight when the connection is lost fails then, not at its deadline: the
	// worker's outbox keeps it and writes it first thing after the reconnection, before another
	// worker can read the job's record (the worker's outbox.go).
	ctx, stop := p.whileConnected(ctx)
	defer stop()
	if done, err := p.createFirst(ctx, st); done || err != nil {
		return err
	}
	return p.updateStatus(ctx, st.ID, func(cur *record) *record {
		if cur != nil && cur.State == StateSucceeded && st.State != StateSucceeded {
			return nil
		}
		return p.nextRecord(ctx, cur, st)
	})
}

// ErrClaimed is ClaimAttempt's answer when the job's record counts the attempt already, or is
// final: another delivery of the job claimed it first.
var ErrClaimed = errors.New("queue: the attempt was claimed by another delivery")

// ClaimAttempt records st, a running record of attempt st.Attempts, unless the job's record
// already counts that attempt or a later one, or is final: then ErrClaimed. It is a
// compare-and-set, so of two deliveries of one job at once (a restarted server may hand an
// unacknowledged job to two workers, each as its first delivery) at most one claims an attempt.
func (p Publisher) ClaimAttempt(ctx context.Context, st Status) error {
	if !validID(st.ID) {
		return fmt.Errorf("queue: claim attempt: invalid job id %q", st.ID)
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	ctx, stop := p.whileConnected(ctx)
	defer stop()
	claimed := false
	err := p.updateStatus(ctx, st.ID, func(cur *record) *record {
		if cur != nil && (cur.State.Terminal() || cur.Attempts >= st.Attempts) {
			claimed = true
			return nil
		}
		return p.nextRecord(ctx, cur, st)
	})
	if err == nil && claimed {
		return fmt.Errorf("%w: %s", ErrClaimed, st.ID)
	}
	return err
}

// nextRecord is the record that st makes of cur (nil: none yet), keeping what st does not say.
func (q *core) nextRecord(ctx context.Context, cur *record, st Status) *record {
	next := record{Status: st, Tenant: st.Tenant, Delivered: st.Delivered, Held: st.Held}
	if cur == nil && (next.CreatedAt.IsZero() || next.Queue == "" || next.Tenant == "") {
		if w, _, err := q.waiting(ctx, st.ID); err == nil {
			cur = &record{Status: w, Tenant: w.Tenant}
		}
	}
	if cur != nil {
		next.Fingerprint = cur.Fingerprint
		if next.Tenant == "" {
			next.Tenant = cur.Tenant
		}
		if next.CreatedAt.IsZero() {
			next.CreatedAt = cur.CreatedAt
		}
		if next.Queue == "" {
			next.Queue = cur.Queue
		}
	}
	return &next
}

// createFirst creates the entry of st when it is most likely the job's first (see
// firstRecord), without reading first, which saves a round trip per job. done is false when
// it did not try, or an entry exists after all: then the caller updates it.
func (q *core) createFirst(ctx context.Context, st Status) (done bool, err error) {
	if !q.firstRecord(st) {
		return false, nil
	}
	next := record{Status: st, Tenant: st.Tenant, Delivered: st.Delivered, Held: st.Held}
	if next.UpdatedAt.IsZero() {
		next.UpdatedAt = q.now().UTC()
	}
	data, err := json.Marshal(next)
	if err != nil {
		return false, nil
	}
	switch _, err = q.kv.Create(ctx, st.ID, data); {
	case err == nil:
		return true, nil
	case isConflict(err):
		return false, nil
	}
	return true, fmt.Errorf("queue: set status %s: %w", st.ID, err)
}

// firstRecord reports whether st is most likely the first entry of its job: the outcome of
// its first delivery, of a job without an Idempotency-Key (its id carries its queue's tag)
// in a queue that is not fair (whose jobs get their entry when published), with everything
// an entry needs already in st.
func (q *core) firstRecord(st Status) bool {
	if st.Delivered != 1 || st.Queue == "" || st.CreatedAt.IsZero() || !findable(st.Queue, st.ID) {
		return false
	}
	spec, ok := q.spec(st.Queue)
	return ok && !spec.Fair
}

// recordUnsent records that delivery m of a job of queue name was handed back untried (a late
// job that the fetch path NAKs, pull.go): the job's record as a worker's pass that sends
// nothing writes it, its state, attempts and holds as they were, with m's delivery count, so
// that the delivery the NAK makes counts no attempt for m. Attempts are counted from the record:
// its own, plus one per delivery after the one that wrote it (internal/worker's recallState);
// the record takes in those before m, which left none. A job without a record gets one,
// queued. A record that is final, or that m or a later delivery wrote, stays. It reads and
// writes once (compare-and-set); a failure is dropped: the NAK follows either way.
func (q *core) recordUnsent(ctx context.Context, name string, m *nats.Msg) {
	md, err := m.Metadata()
	if err != nil {
		return
	}
	job, err := decode(m.Header, m.Data)
	if err != nil || !validID(job.ID) {
		return
	}
	d := md.NumDelivered
	_ = q.updateStatus(ctx, job.ID, func(cur *record) *record {
		next := record{Status: Status{State: StateQueued, Queue: name, CreatedAt: job.CreatedAt}, Tenant: job.Tenant}
		if cur != nil {
			if cur.State.Terminal() || cur.Delivered >= d {
				return nil
			}
			next = *cur
			next.UpdatedAt = time.Time{}
		}
		if seen := next.Delivered + 1; d > seen {
			next.Attempts += int(d - seen)
		}
		next.Delivered = d
		return &next
	})
}

// updateStatus applies change to the entry of job id with compare-and-set, retrying on
// conflicts. change gets nil when there is no entry, and returns nil to write nothing.
// UpdatedAt is set to now when change leaves it zero.
func (q *core) updateStatus(ctx context.Context, id string, change func(cur *record) *record) error {
	for attempt := 0; ; attempt++ {
		cur, rev, err := q.getRecord(ctx, id)
		var curp *record
		switch {
		case err == nil:
			curp = &cur
		case !errors.Is(err, ErrNotFound):
			return fmt.Errorf("queue: set status %s: %w", id, err)
		}
		next := change(curp)
		if next == nil {
			return nil
		}
		next.ID = id
		if next.UpdatedAt.IsZero() {
			next.UpdatedAt = q.now().UTC()
		}
		data, err := json.Marshal(next)
		if err != nil {
			return fmt.Errorf("queue: set status %s: %w", id, err)
		}
		if curp == nil {
			_, err = q.kv.Create(ctx, id, data)
		} else {
			_, err = q.kv.Update(ctx, id, data, rev)
		}
		if err == nil {
			return nil
		}
		if !isConflict(err) || attempt >= 20 {
			return fmt.Errorf("queue: set status %s: %w", id, err)
		}
	}
}

// isConflict reports whether err is a compare-and-set conflict of the status bucket.
func isConflict(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
