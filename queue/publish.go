package queue

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/retry"
)

// Publisher is the role of a [Queues] that stores jobs and their status: Publish, the status
// reads of a job (Status, Place) and of a queue's backlog (Backlog), and the status records
// the workers write (Record, SetStatus, Records). Get it from a Queues (its zero value is not
// usable); it shares the Queues' connection, and is safe for concurrent use.
type Publisher struct{ *core }

// fingerprint identifies the request behind a job, to tell a true repeat of an Idempotency-Key
// from the key's reuse for something else.
func fingerprint(j *Job) string {
	h := sha256.New()
	for _, s := range []string{j.Method, j.Path} {
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(s))))
		h.Write([]byte(s))
	}
	if j.Direct {
		h.Write([]byte{1})
	} else {
		h.Write([]byte{0})
	}
	h.Write(j.Body)
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// Publish stores job in its queue and returns only after JetStream acknowledged it: a nil error
// means the job is stored and will be delivered, and [Publisher.Status] finds it (queued) from then
// on. It fills in job.ID (with [IDs.JobID] or [NewJobID]) and job.CreatedAt when they are empty.
//
// A job without an Idempotency-Key whose id carries its queue's tag (every id JobID makes
// does) is one message and one JetStream round trip: no status entry is written, because the
// message itself, on its subject of its own, is what Status reads until a worker records the
// job's progress. Any other job is also recorded as queued in the status bucket.
//
// With job.IdempotencyKey set, a repeat of the same tenant's key within the queue's DedupeWindow returns the first job's
// id with Replayed true and enqueues nothing; a repeat whose method, path or body differ
// returns ErrIdempotencyMismatch. See the package documentation for how this holds up under
// concurrency and crashes.
//
// Errors: ErrUnknownQueue (not provisioned), ErrTooLarge (body over Spec.MaxBodyBytes or the
// server's limits), ErrFull (the queue is at MaxDepth or MaxBytes), ErrIdempotencyMismatch, or
// a wrapped NATS error (timeouts after Options.PublishTimeout when ctx has no deadline; the
// server unreachable). On any error no status entry claims the job; a publish that timed out may
// still have been stored, in which case it is delivered, Status reports it queued, and a retry
// with the same Idempotency-Key is recognised.
//
// A failure to write the status entry after the job was stored is not an error: the job is
// accepted, and the first worker that takes it writes the entry.
func (p Publisher) Publish(ctx context.Context, job *Job) (Receipt, error) {
	spec, err := p.prepare(job)
	if err != nil {
		return Receipt{}, err
	}
	ctx, cancel := withDefaultTimeout(ctx, p.opts.PublishTimeout)
	defer cancel()
	if dl, ok := ctx.Deadline(); ok && job.AckBy.IsZero() {
		job.AckBy = dl
	}
	if job.NotBefore.After(p.now()) {
		ctx, stop := p.whileConnected(ctx)
		defer stop()
		return p.publishScheduled(ctx, spec, job)
	}
	subject, stream := p.destination(spec, job)

	if job.IdempotencyKey == "" && !spec.Fair && job.Priority == PriorityNormal && findable(job.Queue, job.ID) {
		owned, err := p.admit(ctx, spec, job, job.ID)
		if err != nil {
			return Receipt{}, err
		}
		ack, err := p.publish(ctx, subject, job, job.ID, stream)
		if err != nil {
			p.releaseLater(owned)
			return Receipt{}, err
		}
		if ack.Duplicate {
			p.releaseLater(owned)
			return Receipt{ID: job.ID, Replayed: true}, nil
		}
		return Receipt{ID: job.ID, Seq: ack.Sequence}, nil
	}

	// Past the plain path, whose one async publish nats.go fails on a reconnect by itself,
	// the requests (the idempotency check, the status write) must end with the connection.
	ctx, stop := p.whileConnected(ctx)
	defer stop()
	fp, msgID, replayed, err := p.checkKey(ctx, job)
	if err != nil {
		return Receipt{}, err
	}
	if replayed {
		return Receipt{ID: job.ID, Replayed: true}, nil
	}
	owned, err := p.admit(ctx, spec, job, msgID)
	if err != nil {
		return Receipt{}, err
	}
	ack, err := p.publish(ctx, subject, job, msgID, stream)
	if err != nil {
		p.releaseLater(owned)
		return Receipt{}, err
	}
	if ack.Duplicate {
		p.releaseLater(owned)
		// Another publish of this key stored its job first, between checkKey and now (or
		// this is a retry of one that did): it is a replay only if it was for this request.
		// The winner writes the record, so this one does not.
		if err := p.checkDuplicate(ctx, job, fp, subject, stream); err != nil {
			return Receipt{}, err
		}
		return Receipt{ID: job.ID, Replayed: true}, nil
	}
	p.recordQueued(ctx, job, fp, msgID != job.ID, spec.Fair, ack.Sequence)
	return Receipt{ID: job.ID, Seq: ack.Sequence}, nil
}

// checkDuplicate tells a publish of job whose message JetStream dropped as a duplicate
// whether the stored job was the same request: it returns ErrIdempotencyMismatch when the
// stored message, or else the job's record, has another fingerprint than fp. Concurrent
// publishes of one key with different bodies all pass checkKey before any record exists; this
// is what answers the losers 422 rather than "replayed".
func (q *core) checkDuplicate(ctx context.Context, job *Job, fp, subject, stream string) error {
	if st, err := q.js.Stream(ctx, stream); err == nil {
		if raw, err := st.GetLastMsgForSubject(ctx, subject); err == nil {
			if stored, err := decode(raw.Header, raw.Data); err == nil && stored.ID == job.ID {
				if fingerprint(stored) != fp {
					return fmt.Errorf("%w: job %s", ErrIdempotencyMismatch, job.ID)
				}
				return nil
			}
		}
	}
	// Already taken by a worker (or, in a fair queue, not the tenant's last message): the
	// record the winner wrote tells, when it has been written by now.
	if rec, _, err := q.getRecord(ctx, job.ID); err == nil && rec.Fingerprint != "" && rec.Fingerprint != fp {
		return fmt.Errorf("%w: job %s", ErrIdempotencyMismatch, job.ID)
	}
	return nil
}

// prepare checks job against its queue's spec, which it returns, and fills in its id and
// creation time.
func (q *core) prepare(job *Job) (Spec, error) {
	if job == nil {
		return Spec{}, errors.New("queue: publish: nil job")
	}
	spec, ok := q.spec(job.Queue)
	if !ok {
		return Spec{}, fmt.Errorf("%w: %q", ErrUnknownQueue, job.Queue)
	}
	if _, ok := ParsePriority(string(job.Priority)); !ok && job.Priority != PriorityNormal {
		return Spec{}, fmt.Errorf("queue: publish: invalid priority %q", job.Priority)
	}
	if job.Priority != PriorityNormal && job.Priority != "" && !spec.Priorities && !spec.Fair {
		return Spec{}, fmt.Errorf("%w: %q (priorities: true gives it levels)", ErrNoPriorities, job.Queue)
	}
	if spec.MaxBodyBytes > 0 && int64(len(job.Body)) > spec.MaxBodyBytes {
		return Spec{}, fmt.Errorf("%w: %d bytes, queue %q accepts %d", ErrTooLarge, len(job.Body), job.Queue, spec.MaxBodyBytes)
	}
	if err := q.assignID(job); err != nil {
		return Spec{}, err
	}
	if job.CreatedAt.IsZero() {
		job.CreatedAt = q.now().UTC()
	}
	return spec, nil
}

// checkKey looks up the record of job's Idempotency-Key, if it has one: replayed when the key
// already made a job (ErrIdempotencyMismatch when for another request). It returns the
// request's fingerprint ("" without a key) and the message id to publish under: the job id,
// or for a key whose earlier job was withdrawn, the job id with a suffix, so that the stream's
// duplicate window does not drop the new one.
func (q *core) checkKey(ctx context.Context, job *Job) (fp, msgID string, replayed bool, err error) {
	if job.IdempotencyKey == "" {
		return "", job.ID, false, nil
	}
	fp = fingerprint(job)
	rec, _, err := q.getRecord(ctx, job.ID)
	switch {
	case err == nil && rec.Retracted:
		// An earlier publish with this key was answered as failed and withdrawn: this one is
		// a new job under the same id, past the stream's duplicate window for that one.
		return fp, job.ID + "." + strconv.FormatInt(q.now().UnixNano(), 36), false, nil
	case err == nil:
		if rec.Fingerprint != "" && rec.Fingerprint != fp {
			return "", "", false, fmt.Errorf("%w: job %s", ErrIdempotencyMismatch, job.ID)
		}
		return fp, job.ID, true, nil
	case !errors.Is(err, ErrNotFound):
		return "", "", false, fmt.Errorf("queue: publish %s: check idempotency record: %w", job.ID, err)
	}
	return fp, job.ID, false, nil
}

// assignID gives job its id: derived from its Idempotency-Key, new, or the caller's, checked.
func (q *core) assignID(job *Job) error {
	switch {
	case job.ID == "" && job.IdempotencyKey != "":
		job.ID = q.ids.JobID(job.Queue, job.Tenant, job.IdempotencyKey)
	case job.ID == "":
		job.ID = NewJobID(job.Queue)
	case !validID(job.ID):
		return fmt.Errorf("queue: publish: invalid job id %q", job.ID)
	}
	return nil
}

// recordQueued records the stored job as queued unless a worker (or the publish that won a
// race for its id) already wrote a status, or over a retracted record (overwrite); in a fair
// queue (inBacklog) with its place in the backlog, seq. A failure is not the caller's: the
// first worker to take the job writes the entry. It is not cut short by ctx's deadline.
func (q *core) recordQueued(ctx context.Context, job *Job, fp string, overwrite, inBacklog bool, seq uint64) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), q.opts.PublishTimeout)
	defer cancel()
	rec := record{Status: Status{
		ID: job.ID, Queue: job.Queue, State: StateQueued, CreatedAt: job.CreatedAt, UpdatedAt: q.now().UTC(),
	}, Fingerprint: fp, Tenant: job.Tenant}
	if !job.NotBefore.IsZero() {
		nb := job.NotBefore.UTC()
		rec.State, rec.NotBefore = StateScheduled, &nb
	}
	if inBacklog {
		rec.BacklogSeq, rec.Priority = seq, job.Priority
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return
	}
	if overwrite {
		_, _ = q.kv.Put(sctx, job.ID, data)
	} else {
		_, _ = q.kv.Create(sctx, job.ID, data)
	}
}

// publishOpts are the options of every job publish. Message id and expected stream are set as
// headers by publish itself.
var publishOpts = []jetstream.PublishOpt{
	jetstream.WithRetryAttempts(20),
	jetstream.WithRetryWait(100 * time.Millisecond),
}

// publish sends job to subject with message id msgID, expecting stream, and waits for its own
// PubAck. It publishes asynchronously and waits on the future: concurrent callers share the
// connection's one ack subscription, and a reconnect fails the pending futures at once instead
// of leaving each caller to its deadline (BenchmarkPublish compares it with a request per
// call). No-responder replies (a restart or leader election) are retried.
func (q *core) publish(ctx context.Context, subject string, job *Job, msgID, stream string) (*jetstream.PubAck, error) {
	meta, err := appendEnvelope(make([]byte, 0, envelopeSize(job)), job)
	if err != nil {
		return nil, fmt.Errorf("queue: encode job %s: %w", job.ID, err)
	}
	vals := []string{string(meta), msgID, stream}
	m := &nats.Msg{Subject: subject, Data: job.Body, Header: nats.Header{
		hdrJob: vals[0:1:1], hdrMsgID: vals[1:2:2], hdrExpectedStream: vals[2:3:3],
	}}
	if len(job.tickets) > 0 {
		m.Header[hdrTickets] = []string{string(appendTickets(nil, job.tickets))}
	}
	if !job.NotBefore.IsZero() && stream == q.schedStreamName(job.Queue) {
		m.Header[hdrSchedule] = []string{scheduleAt(job.NotBefore)}
		m.Header[hdrScheduleTarget] = []string{q.dueSubject(job.Queue, job.ID)}
	}
	f, err := q.pub.PublishMsgAsync(m, publishOpts...)
	if err != nil {
		return nil, publishError(job, err) // not sent: the connection is down (no reconnect buffer)
	}
	select {
	case ack := <-f.Ok():
		return ack, nil
	case err := <-f.Err():
		if retractable(err) {
			q.startRetract(job, subject, stream, nil)
		}
		return nil, publishError(job, err)
	case <-ctx.Done():
		// The caller answers "not stored"; make that true if the message lands after all.
		q.startRetract(job, subject, stream, f)
		return nil, publishError(job, ctx.Err())
	}
}

// retractable reports whether a publish that failed with err may still have been stored: any
// failure but JetStream's own refusal, which is final.
func retractable(err error) bool {
	var apiErr *jetstream.APIError
	return !errors.As(err, &apiErr)
}

// retractPolicy spaces retract's tries to reach JetStream: 100ms doubling to 5s, for up to
// 2 minutes.
var retractPolicy = retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: -1,
	MaxElapsed: 2 * time.Minute}

// startRetract runs retract in the background, tracked by Close.
func (q *core) startRetract(job *Job, subject, stream string, f jetstream.PubAckFuture) {
	q.retracts.Add(1)
	go func() {
		defer q.retracts.Done()
		q.retract(job, subject, stream, f)
	}()
}

// retract makes a failed publish of job false: it waits for the publish's outcome (f, when it
// is still pending), and when the message was stored after all (its acknowledgement came late,
// or was lost with the connection), it records the job as canceled (retracted) and deletes the
// message, retrying until JetStream answers, for up to 2 minutes (retractPolicy) or until Close. The status
// comes first, so a worker that already took the message finds it canceled (see Job.AckBy). A
// message of the same id stored by another publish — an accepted earlier one with the same
// Idempotency-Key — is told apart by its CreatedAt, and left alone.
func (q *core) retract(job *Job, subject, stream string, f jetstream.PubAckFuture) {
	if f != nil {
		select { // the outcome, or the async publish's own timeout
		case <-f.Ok():
		case <-f.Err():
		case <-q.closing.Done():
		}
	}
	b := retractPolicy.Backoff(nil)
	for {
		if done, _ := q.retractOnce(job, subject, stream); done {
			return
		}
		if b.Wait(q.closing, 0) != nil { // JetStream unreachable for 2 minutes, or Close
			return
		}
	}
}

// Close stops the background work of Publish — withdrawing messages stored after their
// publish was answered as failed — once it is done or ctx ends, whichever comes first. Call it
// when the process stops publishing; other methods must not be called after it.
func (q *Queues) Close(ctx context.Context) error {
	defer q.conn.stop(q.nc)
	defer q.stopBackground()
	defer q.pulls.stop()
	done := make(chan struct{})
	go func() {
		q.retracts.Wait()
		q.moves.Wait()
		q.releases.Wait()
		q.releaser.stop()
		q.unsubscribeHold() // after the releases: their fallbacks do not need it
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		q.stopBackground()
		<-done
		return ctx.Err()
	}
}

// retractOnce looks for job's message in its stream and withdraws it; done is false when
// JetStream could not be asked.
func (q *core) retractOnce(job *Job, subject, stream string) (done bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	st, err := q.js.Stream(ctx, stream)
	if err != nil {
		return false, err
	}
	// A fair queue's backlog, or a schedule whose job may have been moved on: recorded
	// withdrawn whether or not the message is found.
	fair := stream == q.backlogStreamName(job.Queue) || stream == q.schedStreamName(job.Queue)
	raw, err := st.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) && !fair {
		return true, nil // never stored, or already taken and acked
	}
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, err
	}
	mine := false
	if raw != nil {
		stored, err := decode(raw.Header, raw.Data)
		mine = err == nil && stored.ID == job.ID && stored.CreatedAt.Equal(job.CreatedAt)
	}
	if !mine && !fair {
		return true, nil // not the message of this publish
	}
	// In a fair queue's backlog the tenant's last message may be a later job, with this one
	// stored before it, or the job may have been moved on to the delivery stream: it is
	// recorded withdrawn all the same, and whichever worker takes it reads that (its storage
	// time is within ambiguity of AckBy) and drops it.
	err = q.updateStatus(ctx, job.ID, func(cur *record) *record {
		if cur != nil && cur.State.Terminal() {
			return nil // a worker got there first: nothing left to withdraw
		}
		next := record{Status: Status{ID: job.ID, Queue: job.Queue, State: StateCanceled, CreatedAt: job.CreatedAt,
			LastError: "not accepted: JetStream acknowledged the job after its publisher had answered that nothing was stored"},
			Tenant: job.Tenant, Retracted: true}
		if cur != nil {
			next.Fingerprint = cur.Fingerprint
		}
		return &next
	})
	if err != nil {
		return false, err
	}
	if !mine {
		return true, nil
	}
	if err := st.DeleteMsg(ctx, raw.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, err
	}
	return true, nil
}

// publishError maps a publish error to this package's sentinels, keeping the original.
func publishError(job *Job, err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case 10077: // JSStreamStoreFailedF: the store refused; the description says why
			d := apiErr.Description
			switch {
			case strings.Contains(d, "maximum messages"), strings.Contains(d, "maximum bytes"):
				return fmt.Errorf("%w: queue %q: %w", ErrFull, job.Queue, err)
			case strings.Contains(d, "too large"):
				return fmt.Errorf("%w: queue %q: %w", ErrTooLarge, job.Queue, err)
			}
		case 10047, 10028, 10002, 10023: // storage, memory, account resources exhausted
			return fmt.Errorf("%w: queue %q: %w", ErrFull, job.Queue, err)
		case 10054, 10097: // message or header larger than the stream allows
			return fmt.Errorf("%w: queue %q: %w", ErrTooLarge, job.Queue, err)
		}
	}
	if errors.Is(err, nats.ErrMaxPayload) {
		return fmt.Errorf("%w: queue %q: %w", ErrTooLarge, job.Queue, err)
	}
	return fmt.Errorf("queue: publish %s to %q: %w", job.ID, job.Queue, err)
}

// destination is the subject and stream job is stored in: its queue's, its priority level's,
// or, on a fair queue, its tenant's backlog — where it cannot be read by id: it gets a status
// entry, as a job with an Idempotency-Key does, which also keeps its place in the backlog for
// Cancel.
func (p Publisher) destination(spec Spec, job *Job) (subject, stream string) {
	switch {
	case spec.Fair:
		return p.backlogSubject(job.Queue, job.Tenant, job.Priority), p.backlogStreamName(job.Queue)
	case job.Priority != PriorityNormal:
		return p.levelSubject(job.Queue, job.Priority, job.ID), p.levelStreamName(job.Queue, job.Priority)
	}
	return p.jobSubject(job.Queue, job.ID), p.streamName(job.Queue)
}
