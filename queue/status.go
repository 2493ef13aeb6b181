package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// record is the value of a job's entry in the status bucket.
type record struct {
	Status
	// Fingerprint identifies the request of a job with an Idempotency-Key (see fingerprint).
	Fingerprint string `json:"fingerprint,omitempty"`
}

// getRecord reads the entry of job id, returning ErrNotFound when there is none.
func (q *Queues) getRecord(ctx context.Context, id string) (record, uint64, error) {
	if !validID.MatchString(id) {
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
	return r, e.Revision(), nil
}

// Status returns the status of job id. It returns ErrNotFound for an id that was never
// published, or whose status expired (Options.StatusTTL after its last update).
func (q *Queues) Status(ctx context.Context, id string) (Status, error) {
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	r, _, err := q.getRecord(ctx, id)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return Status{}, fmt.Errorf("queue: status %s: %w", id, err)
	}
	return r.Status, err
}

// SetStatus records st as the status of job st.ID; workers call it as a job moves through its
// states. UpdatedAt defaults to now, and CreatedAt and Queue to the recorded ones. A job whose
// recorded state is succeeded keeps it: a late update from a worker whose delivery was
// duplicated (its ack wait expired) is ignored and SetStatus returns nil.
func (q *Queues) SetStatus(ctx context.Context, st Status) error {
	if !validID.MatchString(st.ID) {
		return fmt.Errorf("queue: set status: invalid job id %q", st.ID)
	}
	if st.State == "" {
		return fmt.Errorf("queue: set status %s: empty state", st.ID)
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	return q.updateStatus(ctx, st.ID, func(cur *record) *record {
		if cur != nil && cur.State == StateSucceeded && st.State != StateSucceeded {
			return nil
		}
		next := record{Status: st}
		if cur != nil {
			next.Fingerprint = cur.Fingerprint
			if next.CreatedAt.IsZero() {
				next.CreatedAt = cur.CreatedAt
			}
			if next.Queue == "" {
				next.Queue = cur.Queue
			}
		}
		return &next
	})
}

// updateStatus applies change to the entry of job id with compare-and-set, retrying on
// conflicts. change gets nil when there is no entry, and returns nil to write nothing.
// UpdatedAt is set to now when change leaves it zero.
func (q *Queues) updateStatus(ctx context.Context, id string, change func(cur *record) *record) error {
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
