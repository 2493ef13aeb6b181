package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/queue"
	"github.com/sluice-rl/sluice/retry"
)

// Dead-letter reasons, as counted in sluice_dead_letters_total and written to the dead
// letter.
const (
	reasonMaxAttempts     = "max_attempts"
	reasonPermanent       = "permanent"
	reasonMaxPauseRetries = "max_pause_retries"
)

// job is one job in hand and what is known about it.
type job struct {
	m        *queue.Msg
	prev     queue.Status // the status read on a redelivery; zero on a first delivery
	attempts int          // attempts spent before this delivery
	r        *runner
}

// log returns a logger that names the job's queue, id and delivery count. It is made on each
// call rather than kept with the job: most jobs log nothing, and slog's With allocates.
func (j *job) log() *slog.Logger {
	return j.r.p.log.With("queue", j.r.name, "job", j.m.Job.ID, "delivered", j.m.Delivered)
}

// handle carries one job from the fetch to its ack, nak or dead letter. ctx ends when the
// queue stops fetching (shutdown or reload); hard ends when deliveries in flight must stop.
func (r *runner) handle(ctx, hard context.Context, m *queue.Msg) {
	cfg := *r.cfg.Load()
	stop := keepAlive(m, cfg.AckWait)
	defer stop()
	j := &job{m: m, r: r}

	if !r.recall(ctx, j) {
		return
	}
	if j.attempts >= cfg.MaxAttempts {
		// Its last attempt was made, but its worker died before dead-lettering it.
		last := 0
		if j.prev.Response != nil {
			last = j.prev.Response.Status
		}
		r.deadLetter(j, reasonMaxAttempts, j.prev.LastError, last, j.attempts)
		return
	}

	if r.p.spares != nil {
		// A connection to the upstream ready before the slot, should the delivery need one.
		target := cfg.Upstream
		if m.Job.Direct && cfg.Target != nil {
			target = cfg.Target.URL
		}
		r.p.spares.warm(target)
	}
	r.slotWaiters.Add(1)
	err := r.waitSlot(ctx)
	if r.slotWaiters.Add(-1) == 0 || r.cfg.Load().Fair {
		r.poke() // the fetch loop may be holding back for the slot waiters
	}
	if err != nil {
		r.handBack(j, "")
		return
	}
	if _, canceled := r.p.canceled.Load(m.Job.ID); canceled {
		j.log().Info("worker: job canceled by an operator; not delivered")
		r.p.m.skipped.WithLabelValues(r.name).Inc()
		r.ackFinal(j, true)
		return
	}
	attempt := j.attempts + 1
	// The attempt is recorded (state running, attempts n) while the request is on its way,
	// not before: a status write takes a few round trips to NATS, and any delay between the
	// slot and the request bunches deliveries up at the upstream. On a first delivery it is
	// recorded only if the request is still out after runningAfter (see the package doc).
	// The outcome is recorded only after this write has landed.
	after := time.Duration(0)
	if m.Delivered == 1 {
		after = r.p.runningAfter
	}
	running := r.recordRunning(j, attempt, after)
	start := r.p.now()
	resp, err := r.deliver(hard, &cfg, m.Job, attempt)
	elapsed := r.p.now().Sub(start)
	r.p.m.latency.WithLabelValues(r.name).Observe(elapsed.Seconds())
	r.p.m.drain.add(r.name)
	out := classify(resp, err, r.p.now())
	r.observe(out.Class, resp)
	var pause time.Duration
	if out.Class == retry.Pause {
		// Stop every worker at once, before anything else.
		pause = cfg.DefaultPause
		if out.HasWait {
			pause = out.Wait
		}
		r.pause(j, pause)
	}
	running.settle() // the outcome is recorded only after the running record has landed
	if err != nil && hard.Err() != nil {
		// Shutdown cut the delivery short. The upstream may have seen it, so the attempt
		// stays spent; another worker takes the job at once.
		r.p.m.deliveries.WithLabelValues(r.name, "interrupted").Inc()
		r.handBack(j, "delivery interrupted by worker shutdown")
		return
	}
	r.p.m.deliveries.WithLabelValues(r.name, out.Class.String()).Inc()
	var response *queue.Response
	if out.Status != 0 {
		response = &queue.Response{Status: out.Status}
	}
	lastErr := describe(out, err, cfg.Timeout)
	if err != nil && out.Class != retry.Success {
		// The status shows a redacted error; the log keeps the whole of it.
		j.log().Info("worker: delivery failed", "attempt", attempt, "err", err)
	}

	// deadLetterAttempt dead-letters the job after this attempt; DeadLetter records the
	// status (failed, with these attempts) itself.
	deadLetterAttempt := func(reason string) {
		r.deadLetter(j, reason, lastErr, out.Status, attempt)
	}

	switch out.Class {
	case retry.Success:
		// With the outcome recorded, the ack need not be confirmed: were it lost, the job
		// would come back after AckWait and be acked as already final, not delivered again.
		recorded := r.setStatus(j, queue.StateSucceeded, attempt, "", response, nil)
		r.ackFinal(j, recorded)

	case retry.Pause:
		d := pause
		// Deliveries that spent no attempt, this one included: pause retries, plus any
		// crash redeliveries and hand-backs (see the package doc).
		if free := int(m.Delivered) - j.attempts; free > cfg.MaxPauseRetries {
			// Put the unspent attempt back first: DeadLetter reads the count from the status.
			r.setStatus(j, queue.StateRetrying, j.attempts, lastErr, response, nil)
			r.deadLetter(j, reasonMaxPauseRetries,
				fmt.Sprintf("%s; gave up after %d pause retries", lastErr, cfg.MaxPauseRetries),
				out.Status, j.attempts)
			return
		}
		r.retryAfter(j, j.attempts, lastErr, response, d)

	case retry.Retry:
		if attempt >= cfg.MaxAttempts {
			deadLetterAttempt(reasonMaxAttempts)
			return
		}
		d := cfg.Backoff.Delay(attempt, rand.Float64())
		if out.HasWait {
			d = max(d, out.Wait)
		}
		r.retryAfter(j, attempt, lastErr, response, d)

	default:
		deadLetterAttempt(reasonPermanent)
	}
}

// pause pauses the queue for every worker for d, after an upstream 429 or 503.
func (r *runner) pause(j *job, d time.Duration) {
	r.p.m.pauses.WithLabelValues(r.name).Inc()
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	if err := r.p.sched.Pause(ctx, r.name, d); err != nil {
		// The job is still retried after d; other workers may meet a 429 of their own.
		j.log().Warn("worker: pause queue", "err", err, "for", d)
		return
	}
	j.log().Info("worker: upstream throttled; queue paused", "for", d)
}

// recall reads what is known of a redelivered or possibly withdrawn job before it is delivered:
// its recorded state and attempts (a final job is acked, not delivered again), the deliveries
// that left no record, and whether its publisher withdrew it. It reports false when it settled
// the job itself.
func (r *runner) recall(ctx context.Context, j *job) bool {
	m := j.m
	if m.Delivered > 1 {
		st, err := r.status(m.Job.ID)
		switch {
		case err == nil && st.State.Terminal():
			// The outcome was recorded but the ack was lost (a crash, a connection drop):
			// do not deliver it again.
			j.log().Info("worker: redelivered job already final; acking", "state", st.State)
			r.p.m.skipped.WithLabelValues(r.name).Inc()
			r.ackFinal(j, true)
			return false
		case err == nil:
			j.prev, j.attempts = st, st.Attempts
		case !errors.Is(err, queue.ErrNotFound):
			j.log().Warn("worker: read job status; counting its attempts from zero", "err", err)
		}
		// Deliveries after the one that last wrote the status left no record: their worker
		// died or lost its ack, possibly after the upstream saw the request. Count them as
		// spent, so that Sluice-Attempt never repeats a number the upstream has seen.
		if err == nil || errors.Is(err, queue.ErrNotFound) {
			if seen := st.Delivered + 1; m.Delivered > seen {
				j.attempts += int(m.Delivered - seen)
			}
		}
	}
	if ambiguous(m) {
		// Give its publisher the time to withdraw it (queue: retract), then look.
		if !sleep(ctx, time.Until(m.Job.AckBy.Add(retractGrace))) {
			r.handBack(j, "")
			return false
		}
		if st, err := r.status(m.Job.ID); err == nil && st.State == queue.StateCanceled {
			j.log().Info("worker: job withdrawn by its publisher (answered 503); not delivered")
			r.p.m.skipped.WithLabelValues(r.name).Inc()
			r.ackFinal(j, true)
			return false
		}
	}
	return true
}

// Publishes whose message was stored within ambiguity of the publisher giving up (Job.AckBy)
// may have been answered 503 with the message stored all the same; the publisher then
// withdraws it (queue: retract). The worker waits until retractGrace past AckBy for that, and
// checks the job's status, before delivering such a job. The margin covers the clocks of the publisher's host
// and the NATS server disagreeing, and the acknowledgement's way back.
const (
	ambiguity    = time.Second
	retractGrace = time.Second
)

// ambiguous reports whether m was stored so close to (or after) its publisher's deadline that
// the publisher may have answered that nothing was stored.
func ambiguous(m *queue.Msg) bool {
	return !m.Job.AckBy.IsZero() && m.Timestamp.After(m.Job.AckBy.Add(-ambiguity))
}

// classify is retry.Classify, with jobs the queue cannot route counted as permanent.
func classify(resp *http.Response, err error, now time.Time) retry.Outcome {
	var re *routeError
	if errors.As(err, &re) {
		return retry.Outcome{Class: retry.Permanent}
	}
	return retry.Classify(resp, err, now)
}

// describe is the status's last_error for an outcome.
func describe(out retry.Outcome, err error, timeout time.Duration) string {
	switch {
	case out.Class == retry.Success:
		return ""
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("upstream timed out after %v", timeout)
	case err != nil:
		return publicError(err)
	default:
		return fmt.Sprintf("upstream answered %d %s", out.Status, http.StatusText(out.Status))
	}
}

// waitSlot waits until the job may be delivered, with leaky.Wait: it takes a leak slot, sleeps
// until it, and checks that the queue was not paused (nor the schedule's state lost) meanwhile.
// When the schedule cannot be reached it does not deliver: it counts the error and tries again
// after a backoff capped at takeBackoffMax, so delivery resumes within a fraction of a second
// of the store's return. The rate is read afresh on every try, so a reload applies at once.
// It returns ctx's error when ctx ends first.
func (r *runner) waitSlot(ctx context.Context) error {
	start := r.p.now()
	backoff := takeBackoffMin
	held := func() bool { return r.p.control(r.name).PausedAt(r.p.now()) }
	for {
		// An operator's pause holds every worker: no slot is taken while it lasts.
		for held() {
			if !sleep(ctx, heldPoll) {
				return ctx.Err()
			}
		}
		err := leaky.WaitHooks(ctx, r.p.sched, r.name, r.rate(), leaky.Hooks{
			Held:   held,
			OnSlot: func(late time.Duration) { r.p.m.slotLate.WithLabelValues(r.name).Observe(late.Seconds()) },
			OnGiveUp: func(late time.Duration) {
				r.p.m.givenUp.WithLabelValues(r.name).Inc()
				r.p.log.Debug("worker: slot given up; woke too late to use it on time", "queue", r.name, "late", late)
			},
		})
		if err == nil {
			r.p.m.slotWait.WithLabelValues(r.name).Observe(r.p.now().Sub(start).Seconds())
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, leaky.ErrHeld) {
			continue
		}
		r.p.m.takeErrors.WithLabelValues(r.name).Inc()
		if errors.Is(err, leaky.ErrInvalidRate) {
			// Validated configs never get here; do not spin on one that did.
			r.p.log.Error("worker: invalid rate", "queue", r.name, "err", err)
		} else {
			r.p.log.Debug("worker: leak schedule unavailable", "queue", r.name, "err", err)
		}
		if !sleep(ctx, backoff) {
			return ctx.Err()
		}
		backoff = min(2*backoff, takeBackoffMax)
	}
}

// heldPoll is how often a worker looks whether an operator's pause of its queue has ended (the
// controls themselves arrive by a watch, at once).
const heldPoll = 100 * time.Millisecond

// baseRate is the queue's leak rate: the config's, or the one an operator set at run time.
func (r *runner) baseRate() leaky.Rate {
	rate := r.cfg.Load().Rate
	if s := r.p.control(r.name).Rate; s != "" {
		if rt, err := config.ParseRate(s); err == nil && rt.Interval() > 0 {
			rate.Interval = rt.Interval()
		}
	}
	return rate
}

// rate is the leak rate slots are taken at: baseRate, or for an adaptive queue the rate the
// workers learned, when that is lower.
func (r *runner) rate() leaky.Rate {
	rate := r.baseRate()
	if eff := r.learnedRate(); eff > 0 && r.cfg.Load().Adaptive {
		if iv := time.Duration(float64(time.Second) / eff); iv > rate.Interval {
			rate.Interval = iv
		}
	}
	return rate
}

// keepAlive sends InProgress for m every third of ackWait until stop is called, so that
// JetStream does not redeliver a job that is waiting for its slot or being delivered. It runs
// on a timer, not a goroutine of its own: most jobs are done long before it first fires.
// stop returns once no InProgress is being sent.
func keepAlive(m *queue.Msg, ackWait time.Duration) (stop func()) {
	k := &keeper{m: m, every: max(ackWait/3, 10*time.Millisecond)}
	k.mu.Lock()
	k.t = time.AfterFunc(k.every, k.fire)
	k.mu.Unlock()
	return k.stop
}

// keeper is the state of one keepAlive.
type keeper struct {
	m       *queue.Msg
	every   time.Duration
	mu      sync.Mutex
	t       *time.Timer
	stopped bool
	firing  sync.WaitGroup // an InProgress being sent
}

func (k *keeper) fire() {
	k.mu.Lock()
	if k.stopped {
		k.mu.Unlock()
		return
	}
	k.firing.Add(1)
	k.mu.Unlock()
	defer k.firing.Done()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	_ = k.m.InProgress(ctx) // a failure is seen again at the ack
	cancel()
	k.mu.Lock()
	if !k.stopped {
		k.t.Reset(k.every)
	}
	k.mu.Unlock()
}

func (k *keeper) stop() {
	k.mu.Lock()
	k.stopped = true
	k.t.Stop()
	k.mu.Unlock()
	k.firing.Wait()
}

// status reads the job's status record.
func (r *runner) status(id string) (queue.Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	return r.p.q.Status(ctx, id)
}

// setStatus records the job's state and reports whether it did. A failure is logged: the
// status is informative, and the job's fate is decided by its ack.
func (r *runner) setStatus(j *job, state queue.State, attempts int, lastErr string, resp *queue.Response, next *time.Time) bool {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	created := j.m.Job.CreatedAt
	if !j.prev.CreatedAt.IsZero() {
		created = j.prev.CreatedAt
	}
	st := queue.Status{
		ID:            j.m.Job.ID,
		Queue:         r.name,
		State:         state,
		Attempts:      attempts,
		CreatedAt:     created,
		UpdatedAt:     r.p.now(),
		LastError:     lastErr,
		Response:      resp,
		NextAttemptAt: next,
		Tenant:        j.m.Job.Tenant,
		Delivered:     j.m.Delivered,
	}
	if err := r.p.q.SetStatus(ctx, st); err != nil {
		j.log().Warn("worker: record job status", "state", state, "err", err)
		return false
	}
	return true
}

// ackFinal acks a job whose outcome is final. When recorded says the final status is in the
// status record, the ack is not confirmed (queue.Msg.AckNoWait), which saves a round trip: a
// lost ack only brings the job back after AckWait, to be acked as already final without being
// delivered again. Otherwise the ack waits for the server's confirmation, as nothing else
// would stop a redelivery.
func (r *runner) ackFinal(j *job, recorded bool) {
	if recorded {
		err := j.m.AckNoWait()
		if err == nil {
			return
		}
		j.log().Debug("worker: ack without confirmation failed; confirming", "err", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := j.m.Ack(ctx); err != nil {
		j.log().Warn("worker: ack failed; the job will be redelivered and skipped", "err", err)
	}
}

// runningRecord is the running record of one delivery attempt, written while the request is
// on its way (recordRunning).
type runningRecord struct {
	timer *time.Timer   // nil when the write started at once
	done  chan struct{} // closed when the write has finished
	ok    bool          // whether it was written; read after done is closed
}

// recordRunning records the job as running its attempt once after has passed (at once when
// after <= 0), without delaying the caller. settle cancels it if it has not started.
func (r *runner) recordRunning(j *job, attempt int, after time.Duration) *runningRecord {
	rr := &runningRecord{done: make(chan struct{})}
	write := func() {
		defer close(rr.done)
		rr.ok = r.setStatus(j, queue.StateRunning, attempt, j.prev.LastError, j.prev.Response, nil)
	}
	if after <= 0 {
		go write()
	} else {
		rr.timer = time.AfterFunc(after, write)
	}
	return rr
}

// settle cancels the write if it has not started, or else waits for it to finish, and reports
// whether the running record was written.
func (rr *runningRecord) settle() bool {
	if rr.timer != nil && rr.timer.Stop() {
		return false
	}
	<-rr.done
	return rr.ok
}

// retryAfter records the job as retrying and naks it for redelivery after d.
func (r *runner) retryAfter(j *job, attempts int, lastErr string, resp *queue.Response, d time.Duration) {
	next := r.p.now().Add(d)
	r.setStatus(j, queue.StateRetrying, attempts, lastErr, resp, &next)
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := j.m.NakWithDelay(ctx, d); err != nil {
		j.log().Warn("worker: nak failed; the job will be redelivered after AckWait", "err", err)
	}
}

// handBack returns the job for immediate redelivery, to this worker or another. When the
// delivery was cut short, why says so and the status records it.
func (r *runner) handBack(j *job, why string) {
	r.p.m.handedBack.WithLabelValues(r.name).Inc()
	r.p.handedBack.Add(1)
	if why != "" {
		r.setStatus(j, queue.StateRetrying, j.attempts+1, why, nil, nil)
	} else {
		// Not sent: record this delivery, so that the next one does not count it as an
		// attempt the upstream may have seen (see handle).
		state := queue.StateQueued
		if j.prev.State != "" {
			state = j.prev.State // what it was when this delivery took it
		}
		r.setStatus(j, state, j.attempts, j.prev.LastError, j.prev.Response, nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := j.m.Nak(ctx); err != nil {
		j.log().Warn("worker: hand back failed; the job will be redelivered after AckWait", "err", err)
	}
}

// deadLetter moves the job to the dead-letter stream, which records its status as failed with
// the attempts of its status record, reason and lastErr as last_error, and lastStatus.
func (r *runner) deadLetter(j *job, reason, lastErr string, lastStatus, attempts int) {
	r.p.m.deadLetters.WithLabelValues(r.name, reason).Inc()
	j.log().Warn("worker: job dead-lettered", "reason", reason, "attempts", attempts, "last_error", lastErr)
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := r.p.q.DeadLetter(ctx, j.m, reason+": "+lastErr, lastStatus, attempts); err != nil {
		j.log().Error("worker: dead-letter failed; the job will be redelivered", "err", err)
	}
}
