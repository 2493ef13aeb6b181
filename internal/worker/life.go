package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-rl/sluice/queue"
	"github.com/sluice-rl/sluice/retry"
)

// handle carries one job through its life — recall, admission (the runner's policies: its
// place, its leak slot, ...), send — and then applies what settle makes of how that ended.
// ctx ends when the queue stops fetching (shutdown or reload); hard ends when deliveries in
// flight must stop.
//
// A plan that pauses nothing frees the job's place among the runner's Concurrency (free)
// before it is carried out: the upstream is done with the job, and its status write and ack
// need not hold up the next delivery. At most Concurrency jobs of a runner settle so at once;
// free is called anyway when handle returns, and is idempotent.
func (r *runner) handle(ctx, hard context.Context, m *queue.Msg, free func()) {
	cfg := r.cfg.Load()
	j := &job{m: m, msg: r.p.settler(m), queue: r.name}
	stop := keepAlive(r.p.exec.ctx, j.msg, cfg.AckWait)
	defer stop()
	out := r.live(ctx, hard, cfg, j)
	p := settle(j.state, out, cfg, rand.Float64())
	if p.pause == 0 {
		if r.settling.Add(1) <= int64(cfg.Concurrency) {
			free()
		}
		defer r.settling.Add(-1)
	}
	r.p.exec.apply(j, p)
}

// live takes j as far as it goes in one pass and returns how the pass ended.
func (r *runner) live(ctx, hard context.Context, cfg *QueueConfig, j *job) outcome {
	if !r.awaitConnected(ctx) {
		return outcome{end: endNotSent}
	}
	if end, stop := r.recall(ctx, cfg, j); stop {
		return outcome{end: end}
	}
	releases, out, stop := r.pol.admission(ctx, cfg, j, r.p.now)
	if stop {
		return out
	}
	defer release(releases)
	return r.send(hard, cfg, j)
}

// recall reads what is known of a redelivered or possibly withdrawn job before it is
// delivered (recallState), and reports whether the pass ends here.
func (r *runner) recall(ctx context.Context, cfg *QueueConfig, j *job) (passEnd, bool) {
	m := j.m
	var (
		st  queue.Status
		err error
	)
	r.noticeReconnect(cfg) // here, not at the fetch: a fetch may have begun before a reconnect
	switch waited, ok := r.awaitOutboxes(ctx, j); {
	case !ok:
		r.memo.recalled.Delete(m)
		return endNotSent, true
	case waited:
		r.memo.recalled.Delete(m) // read before the outboxes landed
	}
	read := m.Delivered > 1 || r.suspect()
	if read {
		if v, ok := r.memo.recalled.LoadAndDelete(m); ok {
			st, err = v.(recalled).st, v.(recalled).err
		} else {
			st, err = r.p.exec.status(j)
		}
		if err != nil && !errors.Is(err, queue.ErrNotFound) {
			r.p.exec.logger(j).Warn("worker: read job status failed; handing the job back, as its attempts are unknown", "err", err)
		}
	}
	if kept, ok := r.p.exec.outbox.record(m.Job.ID); ok { // newer than any record NATS has
		st, err, read = kept, nil, true
	}
	s, end, stop := recallState(m.Delivered, st, err, read, cfg.MaxAttempts)
	s.tenant = m.Job.Tenant
	j.state = s
	if stop {
		if end == endFinal {
			r.p.exec.logger(j).Info("worker: redelivered job already final; acking", "state", st.State)
		}
		return end, true
	}
	if ambiguous(m) {
		if end, stop := r.withdrawn(ctx, j); stop {
			return end, true
		}
	}
	// A scheduled job is never delivered before its time, on this worker's clock either; the
	// mover held it for its time on its own (queue.MoveDue), so this waits for clock skew.
	if d := time.Until(m.Job.NotBefore); d > 0 && retry.Sleep(ctx, nil, d) != nil {
		return endNotSent, true
	}
	return 0, false
}

// recallMemo is what recall knows across a runner's jobs: the window in which first deliveries
// read their record (suspectUntil, Unix ns; suspect), the broker's reconnect count when the
// runner last looked and when it saw it change (reconnectedAt, Unix ns), when the job store
// first answered after that (answeredAt, Unix ns), and the records read ahead with their fetch
// (readRecords).
type recallMemo struct {
	suspectUntil  atomic.Int64
	reconnectedAt atomic.Int64
	answeredAt    atomic.Int64
	claimUntil    atomic.Int64 // Unix ns: until then first deliveries claim their attempt (claims)
	reconnects    atomic.Uint64
	recalled      sync.Map // *queue.Msg → recalled
}

// recalled is a job's record as readRecords read it: err is queue.ErrNotFound for none.
type recalled struct {
	st  queue.Status
	err error
}

// readRecords reads in one round trip (queue.Queues.Records) the records of the fetched jobs
// that recall would otherwise read one at a time — redeliveries, and every job while first
// deliveries are suspect — and keeps them for recall. When the batched read fails, recall
// reads each.
func (r *runner) readRecords(ctx context.Context, cfg *QueueConfig, msgs []*queue.Msg) {
	r.noticeReconnect(cfg)
	suspect := r.suspect()
	ids := make([]string, 0, len(msgs))
	for _, m := range msgs {
		if m.Job != nil && (m.Delivered > 1 || suspect) {
			ids = append(ids, m.Job.ID)
		}
	}
	if len(ids) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	recs, err := r.p.q.Records(rctx, ids)
	if err != nil {
		r.p.log.Debug("worker: batched read of job records failed; reading one by one", "queue", r.name, "err", err)
		return
	}
	for _, m := range msgs {
		if m.Job == nil || (m.Delivered <= 1 && !suspect) {
			continue
		}
		rc := recalled{err: queue.ErrNotFound}
		if st, ok := recs[m.Job.ID]; ok {
			rc = recalled{st: st}
		}
		r.memo.recalled.Store(m, rc)
	}
}

// withdrawn tells whether job j, whose publish was ambiguous, was withdrawn by its publisher
// (queue: retract) or canceled meanwhile: the pass ends then. It gives the publisher the time
// to withdraw it, then looks at its status — but a scheduled job's status, once its
// publisher wrote it (which it does only after JetStream acknowledged the job), says at once
// that the job was accepted.
func (r *runner) withdrawn(ctx context.Context, j *job) (passEnd, bool) {
	m := j.m
	if !m.Job.NotBefore.IsZero() {
		if st, err := r.p.exec.status(j); err == nil {
			if st.State == queue.StateCanceled {
				r.p.exec.logger(j).Info("worker: scheduled job canceled or withdrawn; not delivered")
				return endWithdrawn, true
			}
			return 0, false
		}
	}
	if retry.Sleep(ctx, nil, time.Until(m.Job.AckBy.Add(retractGrace))) != nil {
		return endNotSent, true
	}
	if st, err := r.p.exec.status(j); err == nil && st.State == queue.StateCanceled {
		r.p.exec.logger(j).Info("worker: job withdrawn by its publisher (answered 503); not delivered")
		return endWithdrawn, true
	}
	return 0, false
}

// suspect reports whether first deliveries must read their status record too: for a while
// after the runner started or its broker reconnected (suspicion), when NATS may have
// restarted and forgotten the delivery counts of jobs acknowledged just before.
func (r *runner) suspect() bool {
	return r.p.now().UnixNano() < r.memo.suspectUntil.Load()
}

// noticeReconnect starts a suspicion window when the broker has reconnected since it last
// looked; recall calls it for each job.
func (r *runner) noticeReconnect(cfg *QueueConfig) {
	if n := r.p.q.Reconnects(); n != r.memo.reconnects.Swap(n) {
		// The window opens once the outboxes had their grace (awaitOutboxes).
		r.memo.suspectUntil.Store(r.p.now().Add(outboxGrace + r.p.suspicion(cfg)).UnixNano())
		r.memo.claimUntil.Store(r.p.now().Add(outboxGrace + r.p.suspicion(cfg)).UnixNano())
		r.memo.reconnectedAt.Store(r.p.now().UnixNano())
		r.p.exec.outbox.wake()
	}
}

// awaitConnected waits while the connection to NATS is down: a job delivered then could be
// neither recorded nor acked, and its redelivery would be certain. It reports false when ctx
// ended first.
func (r *runner) awaitConnected(ctx context.Context) bool {
	for !r.p.q.Connected() {
		if retry.Sleep(ctx, nil, 50*time.Millisecond) != nil {
			return false
		}
	}
	return true
}

// awaitOutboxes holds a delivery until outboxGrace after the job store first answered following
// the latest reconnection to NATS this runner saw, so that the records other workers kept
// through the outage are written before its record is read (outbox.go). It counts from the
// store's answer, not from the reconnection: a restarted server takes a while to recover its
// streams, and the outboxes cannot land before. It reports whether it waited, and false in ok
// when ctx ended first.
func (r *runner) awaitOutboxes(ctx context.Context, j *job) (waited, ok bool) {
	if r.memo.reconnectedAt.Load() == 0 {
		return false, true
	}
	for {
		at, answered := r.memo.reconnectedAt.Load(), r.memo.answeredAt.Load()
		if answered >= at {
			break
		}
		if _, err := r.p.exec.status(j); err == nil || errors.Is(err, queue.ErrNotFound) {
			// max: a wall clock stepped back must not keep this loop probing. A failed swap: another
			// job's probe was first.
			r.memo.answeredAt.CompareAndSwap(answered, max(r.p.now().UnixNano(), at))
			continue
		}
		waited = true
		if retry.Sleep(ctx, nil, 100*time.Millisecond) != nil {
			return true, false
		}
	}
	d := time.Unix(0, r.memo.answeredAt.Load()).Add(outboxGrace).Sub(r.p.now())
	if d <= 0 {
		return waited, true
	}
	return true, retry.Sleep(ctx, nil, d) == nil
}

// claims reports whether j's first delivery must claim its attempt before it is sent
// (executor.claim): in the window after a reconnection to NATS, when a restarted server that
// lost its consumer's state may hand one job to two workers at once, each as a first delivery.
// Outside it a first delivery's running record is written on the way (recordRunning).
func (r *runner) claims(j *job) bool {
	return j.m.Delivered == 1 && r.p.now().UnixNano() < r.memo.claimUntil.Load()
}

// suspicion is how long after a (re)start first deliveries read their record: twice AckWait,
// at least 30s. The jobs whose counts a restart lost come back first (they are the oldest in
// the stream), within an AckWait of it.
func suspicion(cfg *QueueConfig) time.Duration { return max(2*cfg.AckWait, 30*time.Second) }

// send delivers j's attempt and classifies the answer. The attempt is recorded (state
// running) while the request is on its way, not before: on a first delivery only if it is
// still out after runningAfter (see the package doc).
func (r *runner) send(hard context.Context, cfg *QueueConfig, j *job) outcome {
	attempt := j.state.attempts + 1
	after := time.Duration(0)
	if j.m.Delivered == 1 {
		after = r.p.runningAfter
	}
	if r.claims(j) {
		if err := r.p.exec.claim(j, attempt); err != nil {
			// Another worker holds this very delivery (ErrClaimed), or the claim could not be
			// written: either way not sent, and read again in a second.
			r.p.exec.logger(j).Info("worker: attempt not claimed; handing the job back", "attempt", attempt, "err", err)
			return outcome{end: endUnread}
		}
	} else {
		j.running = r.p.exec.recordRunning(j, attempt, after)
	}
	start := r.p.now()
	ctx := hard
	var span trace.Span
	if r.p.tr.On() {
		ctx, span = startDelivery(hard, r.p.tr, j, attempt, start)
	}
	resp, body, st, err := r.deliver(ctx, cfg, j.m.Job, attempt)
	r.p.m.latency.WithLabelValues(r.name).Observe(r.p.now().Sub(start).Seconds())
	r.p.m.drain.add(r.name)
	c := classify(resp, err, r.p.now())
	if span != nil {
		endDelivery(span, c, err)
	}
	a := answer{resp: resp, body: body, stream: st, class: c.Class}
	for _, o := range r.pol.observe {
		o.observe(cfg, j, a)
	}
	if err != nil && hard.Err() != nil {
		// Shutdown cut the delivery short; another worker takes the job at once.
		r.p.m.deliveries.WithLabelValues(r.name, "interrupted").Inc()
		return outcome{end: endInterrupted}
	}
	r.p.m.deliveries.WithLabelValues(r.name, c.Class.String()).Inc()
	tiq := time.Duration(-1)
	if !j.m.Job.CreatedAt.IsZero() {
		tiq = max(start.Sub(j.m.Job.CreatedAt), 0)
	}
	r.p.m.answers.add(r.name, c.Status, tiq)
	if err != nil && c.Class != retry.Success {
		// The status shows a fixed description; the log the whole error but for its query.
		r.p.exec.logger(j).Info("worker: delivery failed", "attempt", attempt, "err", logged(err))
	}
	return outcome{end: endDelivered, class: c.Class, status: c.Status, wait: c.Wait,
		hasWait: c.HasWait, lastErr: describe(c, err, cfg.Timeout)}
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
// the publisher may have answered that nothing was stored. A scheduled job (Job.NotBefore) is
// stored in the queue when it comes due, long after its publish: its timestamp tells nothing
// of the publish, so it always counts, and withdrawn reads its status before delivery (which
// also finds a cancel that came while it was being moved).
func ambiguous(m *queue.Msg) bool {
	if m.Job.AckBy.IsZero() {
		return false
	}
	return !m.Job.NotBefore.IsZero() || m.Timestamp.After(m.Job.AckBy.Add(-ambiguity))
}

// classify is retry.Classify, with jobs the queue cannot route counted as permanent.
func classify(resp *http.Response, err error, now time.Time) retry.Outcome {
	var re *routeError
	if errors.As(err, &re) {
		return retry.Outcome{Class: retry.Permanent}
	}
	out := retry.Classify(resp, err, now)
	if out.Class == retry.Pause && resp != nil {
		// A 429 on a unit budget: pause until the units come back, if later than it asks.
		if d, ok := unitReset(resp.Header, now); ok && d > out.Wait {
			out.Wait, out.HasWait = d, true
		}
	}
	return out
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

// keepAlive sends InProgress for m every third of ackWait until stop is called, so that
// JetStream does not redeliver a job that is waiting for its slot or being delivered. It runs
// on a timer, not a goroutine of its own: most jobs are done long before it first fires.
// stop returns once no InProgress is being sent.
func keepAlive(ctx context.Context, m message, ackWait time.Duration) (stop func()) {
	k := &keeper{ctx: ctx, m: m, every: max(ackWait/3, 10*time.Millisecond)}
	k.mu.Lock()
	k.t = time.AfterFunc(k.every, k.fire)
	k.mu.Unlock()
	return k.stop
}

// keeper is the state of one keepAlive.
type keeper struct {
	ctx     context.Context // the executor's: ends after the shutdown's grace
	m       message
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
	ctx, cancel := context.WithTimeout(k.ctx, opTimeout)
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
