package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Scheduled jobs (Job.NotBefore ahead): they wait in the queue's schedule stream, each as a
// JetStream message schedule of its own (ADR-51: "Nats-Schedule: @at <time>"), and are moved
// into the queue when the server fires it. The schedule stream cannot be the queue's stream
// (a stream with schedules cannot discard new messages, and the queue's stream must, to
// refuse jobs beyond max_depth), and a schedule's target must be a subject of its own stream,
// so the server produces the due job in the schedule stream and [Schedules.MoveDue] moves it on.
//
// A schedule stream and its mover are made on demand (ondemand.go), by the first scheduled
// publish to the queue: a queue that never had a scheduled job costs no stream and no mover
// pulls. Workers learn which queues have one from [Schedules.WatchSchedules].
// docs/design/time.md has the design and what was rejected.

// Schedules is the role of a [Queues] that moves scheduled jobs into their queues when due:
// WatchSchedules tells which queues have a schedule stream, MoveDue moves their due jobs. Get
// it from a Queues (its zero value is not usable); it shares the Queues' connection and its
// background moves (which Queues.Close waits for), and is safe for concurrent use.
type Schedules struct{ *core }

const (
	// hdrSchedule, hdrScheduleTarget: the JetStream headers of a message schedule.
	hdrSchedule       = "Nats-Schedule"
	hdrScheduleTarget = "Nats-Schedule-Target"
	// moverName is the durable consumer of the schedule stream's due jobs.
	moverName = "mover"
	// moverAckWait is how long a mover may hold a due job before another takes it: short, so
	// that a mover that dies makes its jobs late by little.
	moverAckWait = 5 * time.Second
	// earlyMax bounds how long MoveDue holds a due job for its NotBefore (the server fires a
	// schedule at a whole second, up to a second before NotBefore); a job further ahead is
	// handed back to come again then.
	earlyMax = 2 * time.Second
)

func (q *core) schedStreamName(queue string) string { return q.opts.Prefix + "_S_" + queue }
func (q *core) schedStreamPrefix() string           { return q.opts.Prefix + "_S_" }
func (q *core) schedPrefix(queue string) string     { return q.opts.Prefix + ".s." + queue + "." }

// atSubject holds job id's schedule; dueSubject the job once its schedule fired.
func (q *core) atSubject(queue, id string) string  { return q.schedPrefix(queue) + "at." + id }
func (q *core) dueSubject(queue, id string) string { return q.schedPrefix(queue) + "due." + id }

// provisionSchedule creates or updates the schedule stream of queue s and its mover: work
// queue retention (a due job leaves once moved; a schedule is matched by no consumer, so it
// stays until it fires or is canceled), no limits of its own (discarding new messages is not
// possible here: the ledger bounds its jobs, reserveBytes its bytes), schedules allowed.
func (q *core) provisionSchedule(ctx context.Context, s Spec) error {
	name := q.schedStreamName(s.Name)
	_, err := q.ensureStream(ctx, jetstream.StreamConfig{
		Name:              name,
		Description:       "Sluice scheduled jobs of queue " + s.Name,
		Subjects:          []string{q.schedPrefix(s.Name) + ">"},
		Retention:         jetstream.WorkQueuePolicy,
		Discard:           jetstream.DiscardOld,
		Storage:           jetstream.FileStorage,
		Replicas:          s.Replicas,
		Duplicates:        s.StreamDuplicates,
		AllowMsgSchedules: true,
	})
	if err != nil {
		return fmt.Errorf("queue: %q: schedule stream %s: %w", s.Name, name, err)
	}
	_, err = q.ensureConsumer(ctx, name, jetstream.ConsumerConfig{
		Durable:       moverName,
		Description:   "Sluice movers of due jobs of queue " + s.Name,
		FilterSubject: q.schedPrefix(s.Name) + "due.*",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       moverAckWait,
		MaxDeliver:    -1,
		MaxAckPending: s.MaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return fmt.Errorf("queue: %q: consumer %s of %s: %w", s.Name, moverName, name, err)
	}
	return nil
}

// scheduleAt is the Nats-Schedule of a job due at t: the server takes whole seconds, so the
// second t falls in; MoveDue holds the job for the rest.
func scheduleAt(t time.Time) string { return "@at " + t.UTC().Format(time.RFC3339) }

// publishScheduled is Publish for a job whose NotBefore is ahead: it checks the schedule
// stream's bytes, takes the job's tickets (ledger.go: MaxDepth and TenantMaxDepth count it),
// stores the job's schedule, and records it scheduled.
func (q *core) publishScheduled(ctx context.Context, spec Spec, job *Job) (Receipt, error) {
	fp, msgID, replayed, err := q.checkKey(ctx, job)
	if err != nil {
		return Receipt{}, err
	}
	if replayed {
		return Receipt{ID: job.ID, Replayed: true}, nil
	}
	if err := q.ensureSchedule(ctx, spec); err != nil {
		return Receipt{}, err
	}
	unreserve, err := q.reserveBytes(ctx, spec, job)
	if err != nil {
		return Receipt{}, err
	}
	defer unreserve()
	owned, err := q.admit(ctx, spec, job, msgID)
	if err != nil {
		return Receipt{}, err
	}
	subject, stream := q.atSubject(job.Queue, job.ID), q.schedStreamName(job.Queue)
	ack, err := q.publish(ctx, subject, job, msgID, stream)
	if err != nil {
		q.releaseLater(owned)
		if errors.Is(err, jetstream.ErrNoStreamResponse) {
			q.schedules.Delete(job.Queue) // deleted behind our back: the next publish makes it again
		}
		return Receipt{}, err
	}
	if ack.Duplicate {
		q.releaseLater(owned)
		if err := q.checkDuplicate(ctx, job, fp, subject, stream); err != nil {
			return Receipt{}, err
		}
		return Receipt{ID: job.ID, Replayed: true}, nil
	}
	q.recordQueued(ctx, job, fp, msgID != job.ID, false, 0)
	return Receipt{ID: job.ID}, nil
}

// ensureSchedule makes sure queue spec's schedule stream and mover exist: the queue's first
// scheduled publish makes them (ondemand.go).
func (q *core) ensureSchedule(ctx context.Context, spec Spec) error {
	return q.onDemand(ctx, &q.schedules, spec.Name, func(ctx context.Context) error { return q.provisionSchedule(ctx, spec) })
}

// reserveBytes counts job's body among the bytes this process is storing in queue spec's
// schedule stream, and returns ErrFull (reserving nothing) when that would take the stream
// past Spec.MaxBytes: the bodies being stored (read first, this one's included), then the
// stream's bytes (one read), so that a body stored in between is counted twice, never missed.
// The schedule stream cannot discard new messages (a limit would drop the oldest schedules),
// so this is its bound: exact for one process, over by at most the bodies other processes
// store at the same instant. MaxDepth and TenantMaxDepth count scheduled jobs through the
// ledger (ledger.go), exactly. Call the returned func once the publish is over.
func (q *core) reserveBytes(ctx context.Context, spec Spec, job *Job) (unreserve func(), err error) {
	if spec.MaxBytes <= 0 {
		return func() {}, nil
	}
	v, _ := q.schedBytesInFlight.LoadOrStore(spec.Name, new(atomic.Int64))
	pending, n := v.(*atomic.Int64), int64(len(job.Body))
	have := pending.Add(n)
	unreserve = func() { pending.Add(-n) }
	st, err := q.js.Stream(ctx, q.schedStreamName(spec.Name))
	if err != nil {
		unreserve()
		return nil, fmt.Errorf("queue: publish to %q: %w", spec.Name, err)
	}
	if have += int64(st.CachedInfo().State.Bytes); have > spec.MaxBytes {
		unreserve()
		return nil, fmt.Errorf("%w: queue %q: %d bytes of scheduled jobs with this one, max_bytes %d", ErrFull, spec.Name, have, spec.MaxBytes)
	}
	return unreserve, nil
}

// scheduled returns how many jobs of queue name wait in its schedule stream: 0 when it has
// none (no scheduled job was ever published to it).
func (q *core) scheduled(ctx context.Context, name string) (uint64, error) {
	return q.streamMsgs(ctx, q.schedStreamName(name))
}

// moverCreated is the subject of JetStream's advisories that a consumer named mover was
// created, on any stream (a wildcard matches whole tokens only, so the stream's name is
// checked by the subscriber): what tells a worker that a queue's schedule stream can be
// moved from.
const moverCreated = "$JS.EVENT.ADVISORY.CONSUMER.CREATED.*." + moverName

// WatchSchedules calls fn with the name of every queue of this prefix that has a schedule
// stream now (one paged stream listing), then with the name of every queue whose schedule
// stream's mover is created later (JetStream's advisory, one subscription for all queues),
// until ctx ends (nil) or the watch fails. fn may be called twice for a queue, and from another
// goroutine. An advisory sent while the connection was down is lost: a caller watches again
// after a reconnect, which lists the streams again.
func (s Schedules) WatchSchedules(ctx context.Context, fn func(queue string)) error {
	prefix := s.schedStreamPrefix()
	sub, err := s.nc.Subscribe(moverCreated, func(m *nats.Msg) {
		toks := strings.Split(m.Subject, ".")
		if name, ok := strings.CutPrefix(toks[len(toks)-2], prefix); ok {
			fn(name)
		}
	})
	if err != nil {
		return fmt.Errorf("queue: watch schedule streams: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// Subscribed before the listing, so that a stream made in between is not missed.
	lctx, cancel := withDefaultTimeout(ctx, opTimeout)
	err = s.listStreams(lctx, s.opts.Prefix+".s.>", prefix, func(name string, _ jetstream.StreamState) { fn(name) })
	cancel()
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("queue: watch schedule streams: %w", err)
	}
	<-ctx.Done() // a listing cut short by ctx's end is the watch's end, not its failure
	return nil
}

// unschedule removes job id's schedule, and the job if its schedule fired and it was not
// moved yet: for Cancel. A job that was moved on is left to Cancel's other steps.
func (q *core) unschedule(ctx context.Context, queue, id string) {
	st, err := q.js.Stream(ctx, q.schedStreamName(queue))
	if err != nil {
		return
	}
	for _, subject := range []string{q.atSubject(queue, id), q.dueSubject(queue, id)} {
		raw, err := st.GetLastMsgForSubject(ctx, subject)
		if err != nil {
			continue
		}
		if st.Purge(ctx, jetstream.WithPurgeSubject(subject)) == nil {
			q.releaseMsg(ctx, raw.Header)
		}
	}
}

// MoveDue moves jobs of queue name whose schedules fired into the queue: it takes up to limit
// of them (those there now, or else the first to come within wait), holds each until its
// NotBefore (the server fires a schedule up to a second early) and publishes it to the
// queue's stream (a fair queue: its tenant's backlog) under its job id, so that a job moved
// twice — its mover died between the publish and the ack — is dropped as a duplicate within
// Spec.StreamDuplicates; a job moved again later is recognised by its status record. A job
// that finds the queue full stays due and is tried again a second later. It returns how many
// jobs it took, without waiting for their moves, which go on in the background until done or
// ctx ends, and which Close waits for. Any number of processes may call it at once; every
// worker does (package worker). The wait for a first job also ends when cut does (nil: never):
// a worker cuts its long pulls short when they may have been lost with a server. It returns
// ErrNoSchedule while the queue has no schedule stream and mover.
func (s Schedules) MoveDue(ctx context.Context, name string, limit int, wait time.Duration, cut context.Context) (int, error) {
	spec, ok := s.spec(name)
	if !ok {
		return 0, fmt.Errorf("%w: %q", ErrUnknownQueue, name)
	}
	c, err := s.mover(ctx, name)
	if err != nil {
		return 0, err
	}
	batch, err := c.FetchNoWait(max(limit, 1))
	if err != nil {
		return 0, fmt.Errorf("queue: move due jobs of %q: %w", name, err)
	}
	n := s.startMoves(ctx, spec, batch)
	if n > 0 || wait <= 0 {
		return n, nil
	}
	wctx, cancel := context.WithTimeout(ctx, max(wait, time.Millisecond))
	defer cancel()
	if cut != nil {
		defer context.AfterFunc(cut, cancel)()
	}
	if batch, err = c.Fetch(1, longPull(wctx)...); err != nil {
		if wctx.Err() != nil && ctx.Err() == nil {
			return 0, nil // the wait ended or was cut short
		}
		return 0, fmt.Errorf("queue: move due jobs of %q: %w", name, err)
	}
	return s.startMoves(ctx, spec, batch), nil
}

// startMoves starts moveOne for every job of batch and returns how many there were.
func (q *core) startMoves(ctx context.Context, spec Spec, batch jetstream.MessageBatch) int {
	n := 0
	for raw := range batch.Messages() {
		n++
		q.moves.Add(1)
		go func() {
			defer q.moves.Done()
			q.moveOne(ctx, spec, raw)
		}()
	}
	return n
}

// mover returns the mover consumer of queue name, looked up once.
func (q *core) mover(ctx context.Context, name string) (jetstream.Consumer, error) {
	if c, ok := q.movers.Load(name); ok {
		return c.(jetstream.Consumer), nil
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	c, err := q.js.Consumer(ctx, q.schedStreamName(name), moverName)
	if errors.Is(err, jetstream.ErrConsumerNotFound) || noStream(err) {
		return nil, fmt.Errorf("%w: %q", ErrNoSchedule, name)
	}
	if err != nil {
		return nil, fmt.Errorf("queue: mover of %q: %w", name, err)
	}
	q.movers.Store(name, c)
	return c, nil
}

// moveOne moves one due job (MoveDue) and settles its message; moved reports whether it was
// stored in the queue by this call.
func (q *core) moveOne(ctx context.Context, spec Spec, raw jetstream.Msg) (moved bool) {
	job, err := decode(raw.Headers(), raw.Data())
	if err != nil {
		_ = raw.Term() // not a job: nothing to deliver
		return false
	}
	job.Queue = spec.Name
	if early := job.NotBefore.Sub(q.now()); early > earlyMax {
		_ = raw.NakWithDelay(early - earlyMax/2)
		return false
	} else if early > 0 {
		t := time.NewTimer(early)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			_ = raw.Nak()
			return false
		case <-q.closing.Done():
			t.Stop()
			_ = raw.Nak()
			return false
		}
	}
	if md, err := raw.Metadata(); err == nil && md.NumDelivered > 1 && q.movedBefore(ctx, job.ID) {
		// Moved by a mover whose ack was lost, past the duplicate window or a server restart.
		_ = raw.Ack()
		return false
	}
	subject, stream := q.levelSubject(spec.Name, job.Priority, job.ID), q.levelStreamName(spec.Name, job.Priority)
	if spec.Fair {
		subject, stream = q.backlogSubject(spec.Name, job.Tenant, job.Priority), q.backlogStreamName(spec.Name)
	}
	m := nats.NewMsg(subject)
	for k, v := range raw.Headers() {
		if !strings.HasPrefix(k, "Nats-") {
			m.Header[k] = v
		}
	}
	m.Header.Set(hdrMsgID, job.ID)
	m.Header.Set(hdrExpectedStream, stream)
	m.Data = raw.Data()
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	ack, err := q.js.PublishMsg(pctx, m)
	if err != nil {
		_ = raw.NakWithDelay(time.Second) // full, or JetStream unreachable: again in a second
		return false
	}
	if spec.Fair && !ack.Duplicate {
		q.noteBacklogSeq(pctx, job.ID, job.Priority, ack.Sequence)
	}
	_ = raw.DoubleAck(pctx)
	return !ack.Duplicate
}

// movedBefore reports whether job id's status shows it past scheduled: moved, and taken by
// a worker since.
func (q *core) movedBefore(ctx context.Context, id string) bool {
	rec, _, err := q.getRecord(ctx, id)
	return err == nil && rec.State != StateScheduled && rec.State != StateQueued
}

// noteBacklogSeq records where a scheduled job of a fair queue was stored in its tenant's
// backlog, for Cancel. Best effort: a worker reads a scheduled job's status before delivery.
func (q *core) noteBacklogSeq(ctx context.Context, id string, p Priority, seq uint64) {
	_ = q.updateStatus(ctx, id, func(cur *record) *record {
		if cur == nil || cur.State != StateScheduled {
			return nil
		}
		next := *cur
		next.BacklogSeq, next.Priority = seq, p
		return &next
	})
}
