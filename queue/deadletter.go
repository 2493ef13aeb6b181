package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// deadMeta is the Sluice-Dead-Letter header of a dead letter.
type deadMeta struct {
	Reason     string    `json:"reason"`
	LastStatus int       `json:"last_status,omitempty"`
	Attempts   int       `json:"attempts"`
	FailedAt   time.Time `json:"failed_at"`
	Seq        uint64    `json:"seq"` // the job's sequence in its queue's stream
}

func (d deadMeta) json() string {
	b, _ := json.Marshal(d)
	return string(b)
}

// provisionDeadLetters creates or updates the dead-letter stream of queue name: one subject
// (and message) per job id, kept DeadLetterMaxAge.
func (q *core) provisionDeadLetters(ctx context.Context, name string) error {
	_, err := q.ensureStream(ctx, jetstream.StreamConfig{
		Name:              q.dlqStreamName(name),
		Description:       "Sluice dead letters of queue " + name,
		Subjects:          []string{q.dlqSubject(name, "*")},
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		MaxAge:            q.opts.DeadLetterMaxAge,
		MaxMsgsPerSubject: 1,
		Storage:           jetstream.FileStorage,
		Replicas:          q.opts.Replicas,
		Duplicates:        DefaultStreamDuplicates,
	})
	if err != nil {
		return fmt.Errorf("queue: %q: dead-letter stream %s: %w", name, q.dlqStreamName(name), err)
	}
	return nil
}

// ensureDeadLetters makes sure queue name's dead-letter stream exists: its first dead letter
// makes it (ondemand.go).
func (q *core) ensureDeadLetters(ctx context.Context, name string) error {
	return q.onDemand(ctx, &q.deadLetters, name, func(ctx context.Context) error { return q.provisionDeadLetters(ctx, name) })
}

// deadLetterCount returns how many dead letters queue name holds: 0 without a dead-letter
// stream.
func (q *core) deadLetterCount(ctx context.Context, name string) (uint64, error) {
	return q.streamMsgs(ctx, q.dlqStreamName(name))
}

// streamMsgs returns how many messages the stream holds: 0 when it does not exist (a stream
// made on demand that was never needed).
func (q *core) streamMsgs(ctx context.Context, stream string) (uint64, error) {
	st, err := q.js.Stream(ctx, stream)
	if noStream(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return st.CachedInfo().State.Msgs, nil
}

// DeadLetter moves a job that will not be delivered to its queue's dead-letter stream, with
// reason (a human-readable cause), lastStatus (the upstream's last HTTP status, 0 when there
// was none) and attempts, the delivery attempts spent. The caller usually knows attempts best
// (a worker may not have recorded its last attempt); a negative attempts takes them from the
// job's status, or m.Delivered when it has none.
// The steps are ordered so that no job is lost: it publishes the dead letter and waits for its
// PubAck, only then terminates the delivery (the job leaves the queue), and last marks the
// status failed. If it fails before the termination, the job is still in the queue and will be
// redelivered; dead-lettering it again replaces, not duplicates, the dead letter. A job whose
// status already says succeeded (a stale, duplicated delivery) is dropped, not dead-lettered.
func (d Deliveries) DeadLetter(ctx context.Context, m *Msg, reason string, lastStatus, attempts int) error {
	if m == nil || m.Job == nil {
		return errors.New("queue: dead letter: nil message")
	}
	job := m.Job
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()

	known := attempts >= 0
	if !known {
		attempts = int(m.Delivered)
	}
	if st, _, err := d.getRecord(ctx, job.ID); err == nil {
		if st.State == StateSucceeded {
			// A stale delivery of a job another worker finished: drop it, do not dead-letter it.
			if err := m.term(ctx, "already succeeded"); err != nil && !errors.Is(err, ErrSettled) {
				return fmt.Errorf("queue: dead letter %s: %w", job.ID, err)
			}
			return nil
		}
		if !known && st.Attempts > 0 {
			attempts = st.Attempts
		}
	}
	now := d.now().UTC()
	dm, err := encode(d.dlqSubject(job.Queue, job.ID), job)
	if err != nil {
		return err
	}
	dm.Header.Set(hdrDead, deadMeta{
		Reason: reason, LastStatus: lastStatus, Attempts: attempts, FailedAt: now, Seq: m.Seq,
	}.json())
	msgID := "dl-" + job.ID + "-" + strconv.FormatUint(m.Seq, 10)
	if err := d.storeDeadLetter(ctx, job.Queue, dm, msgID); err != nil {
		return fmt.Errorf("queue: dead letter %s: publish: %w", job.ID, err)
	}
	if err := m.term(ctx, "dead-lettered"); err != nil && !errors.Is(err, ErrSettled) {
		return fmt.Errorf("queue: dead letter %s: %w", job.ID, err)
	}
	return d.recordDeadLetter(ctx, job, reason, lastStatus, attempts, now)
}

// storeDeadLetter publishes dm, a dead letter of queue, under message id msgID, making the
// queue's dead-letter stream first unless this process knows it exists.
func (q *core) storeDeadLetter(ctx context.Context, queue string, dm *nats.Msg, msgID string) error {
	if err := q.ensureDeadLetters(ctx, queue); err != nil {
		return err
	}
	_, err := q.js.PublishMsg(ctx, dm, jetstream.WithMsgID(msgID), jetstream.WithExpectStream(q.dlqStreamName(queue)))
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		q.deadLetters.Delete(queue) // deleted behind our back: the next dead letter makes it again
	}
	return err
}

// recordDeadLetter records job failed (dead-lettered) at now, unless it succeeded meanwhile.
func (q *core) recordDeadLetter(ctx context.Context, job *Job, reason string, lastStatus, attempts int, now time.Time) error {
	var resp *Response
	if lastStatus > 0 {
		resp = &Response{Status: lastStatus}
	}
	return q.updateStatus(ctx, job.ID, func(cur *record) *record {
		if cur != nil && cur.State == StateSucceeded {
			return nil
		}
		next := record{Status: Status{
			ID: job.ID, Queue: job.Queue, State: StateFailed, Attempts: attempts,
			CreatedAt: job.CreatedAt, UpdatedAt: now, LastError: reason, Response: resp, DeadLetter: true,
		}, Tenant: job.Tenant}
		if cur != nil {
			next.Fingerprint = cur.Fingerprint
		}
		return &next
	})
}

// DeadLetters returns up to limit dead letters of queue, oldest first (limit <= 0 means 100).
// It returns ErrUnknownQueue when queue is not provisioned.
func (d Deliveries) DeadLetters(ctx context.Context, queue string, limit int) ([]DeadLetter, error) {
	if _, ok := d.spec(queue); !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownQueue, queue)
	}
	if limit <= 0 {
		limit = 100
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	name := d.dlqStreamName(queue)
	st, err := d.js.Stream(ctx, name)
	if noStream(err) {
		return []DeadLetter{}, nil // none yet
	}
	if err != nil {
		return nil, fmt.Errorf("queue: dead letters of %q: %w", queue, err)
	}
	si, err := st.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("queue: dead letters of %q: %w", queue, err)
	}
	if si.State.Msgs == 0 {
		return []DeadLetter{}, nil
	}
	// A consumer that lives for this call only: no acks, removed by the server when idle.
	c, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{
		AckPolicy:         jetstream.AckNonePolicy,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		MemoryStorage:     true,
		InactiveThreshold: time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("queue: dead letters of %q: %w", queue, err)
	}
	defer func() {
		dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		defer dcancel()
		_ = st.DeleteConsumer(dctx, c.CachedInfo().Name)
	}()
	batch, err := c.FetchNoWait(limit)
	if err != nil {
		return nil, fmt.Errorf("queue: dead letters of %q: %w", queue, err)
	}
	out := []DeadLetter{}
	for raw := range batch.Messages() {
		md, err := raw.Metadata()
		if err != nil {
			continue
		}
		out = append(out, deadLetter(queue, raw.Headers(), raw.Data(), md.Sequence.Stream))
	}
	if err := batch.Error(); err != nil && len(out) == 0 && !errors.Is(err, jetstream.ErrNoMessages) {
		return nil, fmt.Errorf("queue: dead letters of %q: %w", queue, err)
	}
	return out, nil
}

// deadLetter decodes one dead letter. An undecodable job (a poison message) comes back with its
// raw body and no metadata.
func deadLetter(queue string, h nats.Header, data []byte, seq uint64) DeadLetter {
	var meta deadMeta
	_ = json.Unmarshal([]byte(h.Get(hdrDead)), &meta)
	job, err := decode(h, data)
	if err != nil {
		job = &Job{Queue: queue, Body: data}
	}
	return DeadLetter{Job: job, Reason: meta.Reason, LastStatus: meta.LastStatus,
		Attempts: meta.Attempts, FailedAt: meta.FailedAt, Seq: seq}
}

// deadLetterOf returns the dead-letter stream of queue and its dead letter id, or
// ErrNotFound (also when the queue has no dead-letter stream: it never had a dead letter).
func (q *core) deadLetterOf(ctx context.Context, queue, id string) (jetstream.Stream, *jetstream.RawStreamMsg, error) {
	st, err := q.js.Stream(ctx, q.dlqStreamName(queue))
	if err == nil {
		var raw *jetstream.RawStreamMsg
		if raw, err = st.GetLastMsgForSubject(ctx, q.dlqSubject(queue, id)); err == nil {
			return st, raw, nil
		}
	}
	if noStream(err) || errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil, fmt.Errorf("%w: no dead letter %s in %q", ErrNotFound, id, queue)
	}
	return nil, nil, fmt.Errorf("queue: replay %s: %w", id, err)
}

// Replay puts dead letter id back on queue as a fresh job with the same id (status queued,
// attempts 0) and removes it from the dead-letter stream; in a fair queue, at the end of its
// tenant's backlog. It returns ErrNotFound when queue
// has no dead letter id, ErrUnknownQueue, or ErrFull when the queue is full. It is safe to
// retry: a crash after the re-publish leaves the dead letter in place, and replaying it again
// within the stream's duplicate window does not enqueue it twice.
func (d Deliveries) Replay(ctx context.Context, queue string, id string) error {
	spec, ok := d.spec(queue)
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownQueue, queue)
	}
	if !validID(id) {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	ctx, cancel := withDefaultTimeout(ctx, d.opts.PublishTimeout)
	defer cancel()
	st, raw, err := d.deadLetterOf(ctx, queue, id)
	if err != nil {
		return err
	}
	job, err := decode(raw.Header, raw.Data)
	if err != nil {
		return fmt.Errorf("queue: replay %s: %w", id, err)
	}
	job.Queue = queue
	job.tickets = nil // released when it was dead-lettered; a replay takes none (ledger.go)
	msgID := "replay-" + id + "-" + strconv.FormatUint(raw.Sequence, 10)
	subject, stream := d.jobSubject(queue, id), d.streamName(queue)
	if spec.Fair {
		// Back into its tenant's backlog, to wait its turn. The message id starts with the job
		// id, which the scheduler takes the job's subject from (jobIDOf).
		msgID = id + ".replay-" + strconv.FormatUint(raw.Sequence, 10)
		subject, stream = d.backlogSubject(queue, job.Tenant, job.Priority), d.backlogStreamName(queue)
	}
	ack, err := d.publish(ctx, subject, job, msgID, stream)
	if err != nil {
		return err
	}
	err = d.updateStatus(ctx, id, func(cur *record) *record {
		next := record{Status: Status{ID: id, Queue: queue, State: StateQueued, CreatedAt: job.CreatedAt}, Tenant: job.Tenant}
		if spec.Fair && !ack.Duplicate {
			next.BacklogSeq, next.Priority = ack.Sequence, job.Priority
		}
		if cur != nil {
			if cur.State != StateFailed { // a worker already took the replayed job
				return nil
			}
			next.Fingerprint = cur.Fingerprint
		}
		return &next
	})
	if err != nil {
		return fmt.Errorf("queue: replay %s: %w", id, err)
	}
	if err := st.DeleteMsg(ctx, raw.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		// The replayed job may have been delivered, failed and dead-lettered again meanwhile:
		// its new dead letter replaced this one (one per subject), and the server answers the
		// deletion "no message found" (an error DeleteMsg does not type). Gone is what it wanted.
		if _, gerr := st.GetMsg(ctx, raw.Sequence); !errors.Is(gerr, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("queue: replay %s: remove dead letter: %w", id, err)
		}
	}
	return nil
}

// PurgeDeadLetters deletes the dead letters ids of queue, or all of them when ids is empty, and
// returns how many it deleted.
func (d Deliveries) PurgeDeadLetters(ctx context.Context, queue string, ids []string) (int, error) {
	if _, ok := d.spec(queue); !ok {
		return 0, fmt.Errorf("%w: %q", ErrUnknownQueue, queue)
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	st, err := d.js.Stream(ctx, d.dlqStreamName(queue))
	if noStream(err) {
		return 0, nil // no dead letter yet
	}
	if err != nil {
		return 0, fmt.Errorf("queue: purge dead letters of %q: %w", queue, err)
	}
	if len(ids) == 0 {
		info, err := st.Info(ctx)
		if err != nil {
			return 0, fmt.Errorf("queue: purge dead letters of %q: %w", queue, err)
		}
		if err := st.Purge(ctx); err != nil {
			return 0, fmt.Errorf("queue: purge dead letters of %q: %w", queue, err)
		}
		return int(info.State.Msgs), nil
	}
	n := 0
	for _, id := range ids {
		if !validID(id) {
			continue
		}
		if err := st.Purge(ctx, jetstream.WithPurgeSubject(d.dlqSubject(queue, id))); err != nil {
			return n, fmt.Errorf("queue: purge dead letter %s: %w", id, err)
		}
		n++
	}
	return n, nil
}
