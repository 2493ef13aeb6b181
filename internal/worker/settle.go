package worker

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluice-rl/sluice/queue"
	"github.com/sluice-rl/sluice/retry"
)

// This file holds the worker's whole attempt-accounting policy as two pure functions, recall
// (what a job's record says before it is delivered) and settle (what becomes of it after one
// pass), so that every rule of "Counting attempts" (docs/design/worker.md) is one row of a
// table test and no rule hides in the I/O that carries a plan out (apply.go).

// Dead-letter reasons, as counted in sluice_dead_letters_total and written to the dead
// letter.
const (
	reasonMaxAttempts     = "max_attempts"
	reasonPermanent       = "permanent"
	reasonMaxPauseRetries = "max_pause_retries"
)

// jobState is what is known of a job before this delivery: its JetStream delivery count, the
// attempts it has spent, and the status it was recorded with (zero on a first delivery).
type jobState struct {
	delivered uint64
	attempts  int
	// held is how many of its deliveries were held back unsent while its tenant was paused.
	held int
	// tenant is the job's tenant (Job.Tenant).
	tenant string
	prev   queue.Status
}

// passEnd is how one pass through a job's life ended.
type passEnd int

const (
	// endDelivered: the job was sent and the upstream answered, or the request failed.
	endDelivered passEnd = iota
	// endFinal: a redelivery of a job whose status is already final (its ack was lost).
	endFinal
	// endExhausted: a redelivery of a job whose last attempt was spent by a worker that died
	// before dead-lettering it.
	endExhausted
	// endNotSent: the pass ended before sending (shutdown, reload, a removed queue).
	endNotSent
	// endCanceled: an operator canceled the job while it waited.
	endCanceled
	// endWithdrawn: its publisher withdrew it after answering 503 (queue: retract).
	endWithdrawn
	// endInterrupted: shutdown cut the delivery short; the upstream may have seen it.
	endInterrupted
	// endHold: its tenant is paused (pause_scope: tenant) for outcome.wait; not sent.
	endHold
	// endUnread: its status record had to be read (a redelivery, or a first delivery that may
	// be one) and could not be, or its attempt had to be claimed and was not (runner.claims):
	// not sent, since its attempts are unknown or another delivery holds the attempt.
	endUnread
)

// unreadDelay is how long a job whose record could not be read waits before it comes back.
const unreadDelay = time.Second

// outcome is how a pass ended and, for a delivery, what the upstream answered.
type outcome struct {
	end passEnd
	// class, status, wait and hasWait are retry.Classify's verdict on a delivery.
	class   retry.Class
	status  int // the upstream's HTTP status; 0 when none came
	wait    time.Duration
	hasWait bool
	// lastErr is the status's last_error for a failed delivery (describe).
	lastErr string
}

// settlement is how a job's message is settled.
type settlement int

const (
	// ack: the job is done. Unconfirmed (AckNoWait) when its final status is known to be in
	// the record, confirmed otherwise.
	ack settlement = iota
	// nak: redelivered after plan.delay, its attempt spent or not as the record says.
	nak
	// handBack: redelivered at once, to this worker or another.
	handBack
	// deadLetter: moved to the dead-letter stream, which records the status as failed.
	deadLetter
)

// record is a status to write before the job is settled.
type record struct {
	state    queue.State
	attempts int
	held     int
	lastErr  string
	response *queue.Response
	// next, when hasNext, is how long from now the job will be tried again.
	next    time.Duration
	hasNext bool
}

// plan is what becomes of a job after one pass: settle makes it, apply carries it out, in
// field order — pause the queue, write the record, settle the message.
type plan struct {
	// pause pauses the whole queue for this long first (an upstream's 429 or 503); 0: none.
	// With pauseTenant, it pauses that tenant of the queue instead.
	pause       time.Duration
	pauseTenant string
	// record is the status written before settling; nil: none.
	record *record
	how    settlement
	// final says the job's final status is already in the record (an ack needs no
	// confirmation) even though this plan writes none.
	final bool
	// delay is how long a nak waits before redelivery.
	delay time.Duration
	// reason, deadErr, deadStatus and deadAttempts describe a dead letter.
	reason       string
	deadErr      string
	deadStatus   int
	deadAttempts int
	// skipped counts the job as acked without delivery (sluice_redeliveries_skipped_total).
	skipped bool
}

// recallState is the job's state before this delivery, from its JetStream delivery count and its
// status record (st, with err from reading it; read false when it was not read), and whether
// the pass ends here (endFinal or endExhausted; stop false means deliver it).
//
//   - a first delivery spends from zero and reads no record, but while the broker may have
//     lost delivery counts (read: after a reconnect, or a worker's start), when it is read as
//     a redelivery's would be: a crash of NATS can hand a job out again as a first delivery;
//   - a redelivery whose record is final was acked too late, not lost: ack it, deliver nothing —
//     but for a first delivery whose record says failed: a replayed dead letter;
//   - the attempts spent are the record's, plus every delivery after the one that wrote the
//     record, which left none (its worker died or lost its ack, maybe after the upstream saw
//     the request), so Sluice-Attempt never repeats a number the upstream may have seen;
//   - an unreadable record (not "not found") ends the pass unsent (endUnread): the worker
//     cannot know the attempts spent, and would rather wait than repeat a number;
//   - a job whose attempts are spent is dead-lettered without another delivery.
func recallState(delivered uint64, st queue.Status, err error, read bool, maxAttempts int) (s jobState, end passEnd, stop bool) {
	s.delivered = delivered
	if !read {
		return s, 0, false
	}
	switch {
	case err == nil && delivered <= 1 && st.State == queue.StateFailed:
		// A dead letter replayed by an operator: its record says failed until the replay
		// marks it queued, just after publishing it. Delivered afresh, as before replays read.
		return s, 0, false
	case err == nil && st.State.Terminal():
		return s, endFinal, true
	case err == nil:
		s.prev, s.attempts, s.held = st, st.Attempts, st.Held
	case !errors.Is(err, queue.ErrNotFound):
		return s, endUnread, true
	}
	if seen := st.Delivered + 1; delivered > seen {
		s.attempts += int(delivered - seen)
	}
	if s.attempts >= maxAttempts {
		return s, endExhausted, true
	}
	return s, 0, false
}

// settle decides what becomes of a job in state s after a pass that ended with o, under the
// queue's config cfg; jitter in [0, 1) randomises a retry's backoff. It is pure: apply carries
// the plan out. attempt, the number of this delivery, is s.attempts+1.
func settle(s jobState, o outcome, cfg *QueueConfig, jitter float64) plan {
	p := settleOne(s, o, cfg, jitter)
	if p.record != nil {
		// Every record carries the holds forward, so that they never count as pause retries.
		p.record.held = max(p.record.held, s.held)
	}
	return p
}

func settleOne(s jobState, o outcome, cfg *QueueConfig, jitter float64) plan {
	attempt := s.attempts + 1
	var resp *queue.Response
	if o.status != 0 {
		resp = &queue.Response{Status: o.status}
	}
	switch o.end {
	case endFinal, endCanceled, endWithdrawn:
		// The record is final already (succeeded, failed, canceled): ack, deliver nothing.
		return plan{how: ack, final: true, skipped: true}
	case endExhausted:
		// Its last attempt was made, but its worker died before dead-lettering it.
		last := 0
		if s.prev.Response != nil {
			last = s.prev.Response.Status
		}
		return deadPlan(reasonMaxAttempts, s.prev.LastError, last, s.attempts)
	case endNotSent:
		// Record this delivery as it was, so the next one does not count it as an attempt the
		// upstream may have seen.
		state := queue.StateQueued
		if s.prev.State != "" {
			state = s.prev.State
		}
		return plan{how: handBack, record: &record{state: state, attempts: s.attempts,
			lastErr: s.prev.LastError, response: s.prev.Response}}
	case endHold:
		// Not sent: back after the tenant's pause (and a jitter, so that its jobs do not all
		// come back at one instant), its attempts and pause retries as they were.
		state := queue.StateQueued
		if s.prev.State != "" {
			state = s.prev.State
		}
		d := o.wait + time.Duration(jitter*float64(heldSpread))
		return plan{how: nak, delay: d, record: &record{state: state, attempts: s.attempts, held: s.held + 1,
			lastErr: s.prev.LastError, response: s.prev.Response, next: d, hasNext: true}}
	case endUnread:
		// Its attempts are unknown: no record is written (it could lower the true count), and
		// nothing is sent, so Sluice-Attempt never repeats a number the upstream saw.
		return plan{how: nak, delay: unreadDelay}
	case endInterrupted:
		// The upstream may have seen it: the attempt stays spent.
		return plan{how: handBack, record: &record{state: queue.StateRetrying, attempts: attempt,
			lastErr: "delivery interrupted by worker shutdown"}}
	}
	switch o.class {
	case retry.Success:
		return plan{how: ack, record: &record{state: queue.StateSucceeded, attempts: attempt, response: resp}}
	case retry.Pause:
		return settlePause(s, o, cfg, resp)
	case retry.Retry:
		if attempt >= cfg.MaxAttempts {
			return deadPlan(reasonMaxAttempts, o.lastErr, o.status, attempt)
		}
		d := cfg.Backoff.Delay(attempt, jitter)
		if o.hasWait {
			d = max(d, o.wait)
		}
		return nakPlan(attempt, o.lastErr, resp, d)
	default:
		return deadPlan(reasonPermanent, o.lastErr, o.status, attempt)
	}
}

// settlePause settles a delivery the upstream answered 429 or 503: the whole queue (or with
// pause_scope: tenant, the job's tenant: apply decides) pauses for the answer's wait
// (cfg.DefaultPause without one) and the job is retried after it without spending its
// attempt, until it has had MaxPauseRetries such retries. Those are the deliveries that spent
// no attempt and were sent, this one included (delivered - attempts - held), which also counts
// crash redeliveries and hand-backs: the bound is conservative.
func settlePause(s jobState, o outcome, cfg *QueueConfig, resp *queue.Response) plan {
	d := cfg.DefaultPause
	if o.hasWait {
		d = o.wait
	}
	p := nakPlan(s.attempts, o.lastErr, resp, d)
	p.pause = d
	if cfg.PauseTenant && s.tenant != "" {
		p.pauseTenant = s.tenant
	}
	if free := int(s.delivered) - s.attempts - s.held; free > cfg.MaxPauseRetries {
		// Put the unspent attempt back first: the dead letter reads the count from the record.
		p.how, p.delay, p.record.next, p.record.hasNext = deadLetter, 0, 0, false
		p.reason, p.deadStatus, p.deadAttempts = reasonMaxPauseRetries, o.status, s.attempts
		p.deadErr = fmt.Sprintf("%s; gave up after %d pause retries", o.lastErr, cfg.MaxPauseRetries)
	}
	return p
}

// heldSpread is the most a held job's return is spread past its tenant's pause.
const heldSpread = 100 * time.Millisecond

func nakPlan(attempts int, lastErr string, resp *queue.Response, d time.Duration) plan {
	return plan{how: nak, delay: d, record: &record{state: queue.StateRetrying, attempts: attempts,
		lastErr: lastErr, response: resp, next: d, hasNext: true}}
}

func deadPlan(reason, lastErr string, status, attempts int) plan {
	return plan{how: deadLetter, reason: reason, deadErr: lastErr, deadStatus: status, deadAttempts: attempts}
}
