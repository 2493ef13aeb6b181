package worker

import (
	"context"
	"log/slog"
	"time"

	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/queue"
	"github.com/sluice-rl/sluice/retry"
)

// job is one job in hand and what is known about it.
type job struct {
	m     *queue.Msg // the delivery: the job, its delivery count; what a dead letter moves
	msg   message    // settles m; m itself but in tests of the executor
	queue string
	state jobState
	// running is the running record of the delivery, nil before it was sent.
	running *runningRecord
	// charge is what its slot charged the queue's unit budget, when charged (unitBudget).
	charge  leaky.Charge
	charged bool
	// charges are what its slot charged each of the queue's budgets, in their order, when
	// charged (budgets.go).
	charges []leaky.Charge
	// gather: its status write waits for the next apply tick (handle; see applyTick).
	gather bool
}

// executor carries plans out: it pauses the queue, writes status records and settles
// messages. Every call it makes is bounded by opTimeout and by ctx, which ends a short grace
// after the shutdown timeout, so a shutdown returns in time even while NATS or Redis cannot be
// reached. It is safe for concurrent use.
type executor struct {
	ctx   context.Context
	store jobStore
	sched leaky.Schedule // pauses queues; nil: a plan's pause is not applied
	m     *metrics
	log   *slog.Logger
	now   func() time.Time
	// handedBack counts the jobs handed back, for the shutdown's log line.
	handedBack func()
	// tenantsPaused hears the tenants of a queue paused after a plan paused one; may be nil.
	tenantsPaused func(queue string, paused map[string]time.Duration)
	// outbox keeps the status records whose write failed, to write again (outbox.go).
	outbox *outbox
}

// logger returns a logger that names j's queue, id and delivery count (jobLogger).
func (e *executor) logger(j *job) *slog.Logger { return jobLogger(e.log, j) }

// op returns the context of one call: ctx, bounded by d.
func (e *executor) op(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(e.ctx, d)
}

// apply carries p out for j: the queue's pause, then (once the delivery's running record, if
// any, has landed) the status record, then the message's settlement.
func (e *executor) apply(j *job, p plan) {
	switch {
	case p.pause > 0 && p.pauseTenant != "":
		e.pauseTenant(j, p.pauseTenant, p.pause)
	case p.pause > 0:
		e.pause(j, p.pause)
	}
	if j.running != nil {
		j.running.finish() // the outcome is recorded only after the running record has landed
	}
	recorded := false
	if p.record != nil {
		if j.gather {
			e.awaitTick()
		}
		recorded = e.write(j, p.record)
	}
	if p.skipped {
		e.m.skipped.WithLabelValues(j.queue).Inc()
	}
	switch p.how {
	case ack:
		e.ack(j, p.final || recorded)
	case nak:
		ctx, cancel := e.op(opTimeout)
		defer cancel()
		if err := j.msg.NakWithDelay(ctx, p.delay); err != nil {
			e.logger(j).Warn("worker: nak failed; the job will be redelivered after AckWait", "err", err)
		}
	case handBack:
		e.m.handedBack.WithLabelValues(j.queue).Inc()
		if e.handedBack != nil {
			e.handedBack()
		}
		ctx, cancel := e.op(opTimeout)
		defer cancel()
		if err := j.msg.Nak(ctx); err != nil {
			e.logger(j).Warn("worker: hand back failed; the job will be redelivered after AckWait", "err", err)
		}
	case deadLetter:
		e.deadLetter(j, p)
	}
}

// pause pauses j's queue for every worker for d, after an upstream 429 or 503.
func (e *executor) pause(j *job, d time.Duration) {
	e.m.pauses.WithLabelValues(j.queue).Inc()
	if e.sched == nil {
		return
	}
	ctx, cancel := e.op(storeTimeout)
	defer cancel()
	if err := e.sched.Pause(ctx, j.queue, d); err != nil {
		// The job is still retried after d; other workers may meet a 429 of their own.
		e.logger(j).Warn("worker: pause queue", "err", err, "for", d)
		return
	}
	e.logger(j).Info("worker: upstream throttled; queue paused", "for", d)
}

// pauseTenant pauses j's tenant of its queue for every worker for d, after an upstream 429 or
// 503 on a queue that pauses by tenant.
func (e *executor) pauseTenant(j *job, tenant string, d time.Duration) {
	e.m.pauses.WithLabelValues(j.queue).Inc()
	tp, ok := e.sched.(leaky.TenantPauses)
	if !ok {
		return
	}
	ctx, cancel := e.op(storeTimeout)
	defer cancel()
	paused, err := tp.PauseTenant(ctx, j.queue, tenant, d)
	if err != nil {
		// The job is still retried after d; the tenant's other jobs may meet a 429 of their own.
		e.logger(j).Warn("worker: pause tenant", "err", err, "for", d)
		return
	}
	if e.tenantsPaused != nil {
		e.tenantsPaused(j.queue, paused)
	}
	e.logger(j).Info("worker: upstream throttled; tenant paused", "tenant", tenant, "for", d)
}

// applyTick is the period of the apply ticks: the status writes (and so the acks) of a
// queue's deliveries paced by its rate at hundreds a second or more wait for the next instant
// of the wall clock that is a multiple of it. Spread one by one over time, as a paced queue
// spreads them, each write and ack is a message of its own through every process and
// nats-server's JetStream loops; gathered at the ticks, the writes of every worker of every
// process (whose clocks agree to well under a tick) reach nats-server together and are stored,
// answered and followed by their acks in shared reads, writes and wake-ups. At 2 000/s this
// halved nats-server's CPU per job (BENCHMARKS.md). The cost: a job's final status and its ack
// come up to a tick later; its delivery does not wait, nor its worker's next one (the job has
// freed its place among the runner's concurrency already).
const applyTick = 10 * time.Millisecond

// awaitTick waits for the next apply tick, or for the executor's ctx to end.
func (e *executor) awaitTick() {
	tick := int64(applyTick)
	_ = retry.Sleep(e.ctx, nil, time.Duration(tick-e.now().UnixNano()%tick))
}

// status reads the job's status record.
func (e *executor) status(j *job) (queue.Status, error) {
	ctx, cancel := e.op(opTimeout)
	defer cancel()
	return e.store.Record(ctx, j.m.Job.ID)
}

// write records the job's status and reports whether it did. A failure is logged: the status
// is informative, and the job's fate is decided by its settlement.
func (e *executor) write(j *job, rec *record) bool {
	ctx, cancel := e.op(opTimeout)
	defer cancel()
	st := e.statusOf(j, rec)
	if err := e.store.SetStatus(ctx, st); err != nil {
		e.logger(j).Warn("worker: record job status failed; kept to write again before the job goes out again", "state", rec.state, "err", err)
		e.outbox.keep(st, e.log)
		return false
	}
	e.outbox.written(st)
	return true
}

// claim records j as running attempt before it is sent, unless another delivery of j recorded
// that attempt first (queue.ErrClaimed). Any error means: do not send.
func (e *executor) claim(j *job, attempt int) error {
	ctx, cancel := e.op(opTimeout)
	defer cancel()
	prev := j.state.prev
	st := e.statusOf(j, &record{state: queue.StateRunning, attempts: attempt, lastErr: prev.LastError, response: prev.Response})
	if err := e.store.ClaimAttempt(ctx, st); err != nil {
		return err
	}
	e.outbox.written(st)
	return nil
}

// statusOf is the status record rec makes of j now.
func (e *executor) statusOf(j *job, rec *record) queue.Status {
	created := j.m.Job.CreatedAt
	if !j.state.prev.CreatedAt.IsZero() {
		created = j.state.prev.CreatedAt
	}
	now := e.now()
	st := queue.Status{
		ID:        j.m.Job.ID,
		Queue:     j.queue,
		State:     rec.state,
		Attempts:  rec.attempts,
		CreatedAt: created,
		UpdatedAt: now,
		LastError: rec.lastErr,
		Response:  rec.response,
		Tenant:    j.m.Job.Tenant,
		Delivered: j.m.Delivered,
		Held:      rec.held,
	}
	if rec.hasNext {
		next := now.Add(rec.next)
		st.NextAttemptAt = &next
	}
	return st
}

// ack acks a job whose outcome is final. When recorded says the final status is in the status
// record, the ack is not confirmed (queue.Msg.AckNoWait), which saves a round trip: a lost ack
// only brings the job back after AckWait, to be acked as already final without being delivered
// again. Otherwise the ack waits for the server's confirmation, as nothing else would stop a
// redelivery.
func (e *executor) ack(j *job, recorded bool) {
	if recorded {
		err := j.msg.AckNoWait()
		if err == nil {
			return
		}
		e.logger(j).Debug("worker: ack without confirmation failed; confirming", "err", err)
	}
	ctx, cancel := e.op(opTimeout)
	defer cancel()
	if err := j.msg.Ack(ctx); err != nil {
		if recorded {
			e.logger(j).Warn("worker: ack failed; the job will come back and be acked without a delivery (its status is final)", "err", err)
		} else {
			e.logger(j).Warn("worker: ack failed and its status is not written yet; if the job comes back before the outbox writes it, it is delivered again", "err", err)
		}
	}
}

// deadLetter moves the job to the dead-letter stream, which records its status as failed.
func (e *executor) deadLetter(j *job, p plan) {
	e.m.deadLetters.WithLabelValues(j.queue, p.reason).Inc()
	e.logger(j).Warn("worker: job dead-lettered", "reason", p.reason, "attempts", p.deadAttempts, "last_error", p.deadErr)
	ctx, cancel := e.op(opTimeout)
	defer cancel()
	if err := e.store.DeadLetter(ctx, j.m, p.reason+": "+p.deadErr, p.deadStatus, p.deadAttempts); err != nil {
		e.logger(j).Error("worker: dead-letter failed; the job will be redelivered", "err", err)
	}
}

// runningRecord is the running record of one delivery attempt, written while the request is
// on its way (recordRunning).
type runningRecord struct {
	timer *time.Timer   // nil when the write started at once
	done  chan struct{} // closed when the write has finished
	ok    bool          // whether it was written; read after done is closed
}

// recordRunning records j as running its attempt once after has passed (at once when after
// <= 0), without delaying the caller: a status write takes a few round trips to NATS, and any
// delay between the slot and the request bunches deliveries up at the upstream. finish
// cancels it if it has not started.
func (e *executor) recordRunning(j *job, attempt int, after time.Duration) *runningRecord {
	rr := &runningRecord{done: make(chan struct{})}
	prev := j.state.prev
	write := func() {
		defer close(rr.done)
		rr.ok = e.write(j, &record{state: queue.StateRunning, attempts: attempt,
			lastErr: prev.LastError, response: prev.Response})
	}
	if after <= 0 {
		go write()
	} else {
		rr.timer = time.AfterFunc(after, write)
	}
	return rr
}

// finish cancels the write if it has not started, or else waits for it to finish, and reports
// whether the running record was written.
func (rr *runningRecord) finish() bool {
	if rr.timer != nil && rr.timer.Stop() {
		return false
	}
	<-rr.done
	return rr.ok
}
