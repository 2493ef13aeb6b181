package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Deliveries is the role of a [Queues] that hands jobs to workers — the shared consumer of a
// queue (Consumer) and of its priority levels (LevelConsumer) — and keeps the jobs that failed
// for good: DeadLetter, and the operators' DeadLetters, Replay and PurgeDeadLetters. Get it
// from a Queues (its zero value is not usable); it shares the Queues' connection, and is safe
// for concurrent use.
type Deliveries struct{ *core }

// Consumer is the durable pull consumer of one queue, shared by every worker of every process:
// each job goes to one of them at a time. It is safe for concurrent use.
type Consumer struct {
	q     *core
	queue string
	c     jetstream.Consumer
	key   string // "<stream> <consumer>", the late jobs' key (pull.go)
	next  string // the subject of its pull requests
	// ackWait is the consumer's AckWait, which bounds how long late jobs are kept (lateHold).
	ackWait time.Duration
}

// newConsumer returns the Consumer of queue over c, whose pull requests go out on q's API
// prefix (pull.go).
func newConsumer(q *core, queue string, c jetstream.Consumer) *Consumer {
	ci := c.CachedInfo()
	return &Consumer{q: q, queue: queue, c: c, key: ci.Stream + " " + ci.Name,
		next: q.api + "CONSUMER.MSG.NEXT." + ci.Stream + "." + ci.Name, ackWait: ci.Config.AckWait}
}

// Consumer returns the shared consumer of queue name, making it first for a queue of a
// shared stream that has none yet. It returns ErrUnknownQueue when name is not provisioned.
func (d Deliveries) Consumer(ctx context.Context, name string) (*Consumer, error) {
	s, ok := d.spec(name)
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownQueue, name)
	}
	if err := d.subscribeHold(); err != nil {
		return nil, err
	}
	if _, shared := d.sharedIndex(name); shared {
		// A shared queue's consumer is made by the first worker that wants it (shared.go).
		ctx, cancel := withDefaultTimeout(ctx, opTimeout)
		defer cancel()
		c, err := d.sharedConsumer(ctx, s)
		if err != nil {
			return nil, fmt.Errorf("queue: consumer of %q: %w", name, err)
		}
		return newConsumer(d.core, name, c), nil
	}
	d.mu.RLock()
	c, ok := d.consumers[name]
	d.mu.RUnlock()
	if ok {
		return newConsumer(d.core, name, c), nil
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	c, err := d.js.Consumer(ctx, d.streamName(name), consumerName)
	if err != nil {
		return nil, fmt.Errorf("queue: consumer of %q: %w", name, err)
	}
	return newConsumer(d.core, name, c), nil
}

// Queue returns the name of the consumer's queue.
func (c *Consumer) Queue() string { return c.queue }

// Fetch returns up to limit jobs (1 when limit < 1), waiting at most wait for the first of them;
// it returns as soon as limit jobs are there. With wait <= 0 it returns only what is available now.
// No jobs is not an error: it returns an empty slice.
//
// Each returned job is held by the caller until it calls Ack, Nak, NakWithDelay or
// [Deliveries.DeadLetter], or Spec.AckWait passes without an InProgress, after which JetStream hands
// it to another worker. Keep limit small: jobs fetched and not yet worked on still count against
// AckWait. Cancelling ctx ends the wait early. A job the server sent for a fetch that had stopped
// waiting (ctx ended, or a no-wait fetch's answer came after 1 s) is not lost for an AckWait: the
// next Fetch of the same consumer in this process gets it, or it is handed back for immediate
// redelivery (pull.go).
//
// A message that is not a job envelope (published to the queue's subject by something else) is
// moved to the dead-letter stream and not returned.
func (c *Consumer) Fetch(ctx context.Context, limit int, wait time.Duration) ([]*Msg, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	limit = max(limit, 1)
	raws := c.q.pulls.takeLate(c.key, limit)
	var err error
	if len(raws) == 0 {
		if wait <= 0 {
			raws, err = c.pullOnce(ctx, limit, true)
		} else {
			fctx, cancel := context.WithTimeout(ctx, wait)
			defer cancel()
			raws, err = c.pullOnce(fctx, limit, false)
		}
	}
	var out []*Msg
	for _, nm := range raws {
		raw := &pulled{m: nm, nc: c.q.nc}
		m, err := c.msg(raw)
		if err != nil {
			c.poison(ctx, raw, err)
			continue
		}
		out = append(out, m)
	}
	if err != nil && len(out) == 0 &&
		!errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		return nil, c.fetchErr(err)
	}
	if out == nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return out, nil
}

// fetchErr wraps a failed fetch's err, in ErrConsumerGone too when the consumer no longer
// answers, and then forgets the handle this process keeps of a shared queue's consumer.
func (c *Consumer) fetchErr(err error) error {
	if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrConsumerDeleted) ||
		errors.Is(err, jetstream.ErrConsumerNotFound) {
		c.q.sharedCons.Delete(c.queue)
		c.q.mu.Lock()
		delete(c.q.consumers, c.queue) // looked up again (Deliveries.Consumer)
		c.q.mu.Unlock()
		return fmt.Errorf("queue: fetch %q: %w: %w", c.queue, ErrConsumerGone, err)
	}
	return fmt.Errorf("queue: fetch %q: %w", c.queue, err)
}

// longPull returns the options of a nats.go pull request that waits until ctx ends (the
// schedule's mover; Fetch sends its own, pullFor): ctx's deadline sets its expiry, and a pull
// of 10 s or more gets the rarest idle heartbeat nats.go allows (longPullHeartbeat) instead of
// its default of one every 5 s.
func longPull(ctx context.Context) []jetstream.FetchOpt {
	opts := []jetstream.FetchOpt{jetstream.FetchContext(ctx)}
	if dl, ok := ctx.Deadline(); ok {
		if hb := longPullHeartbeat(time.Until(dl)); hb > 0 {
			opts = append(opts, jetstream.FetchHeartbeat(hb))
		}
	}
	return opts
}

// longPullHeartbeat is the idle heartbeat of a pull that waits left: for 10 s or more one per
// 40% of it (nats.go refuses one longer than half the expiry, which it sets to 90% of the
// wait), else none. Idle pulls are most of what an idle deployment costs nats-server
// (docs/design/queue.md); a pull lost with its server is cut short by its caller (the worker's
// idle.go), not found by missed heartbeats.
func longPullHeartbeat(left time.Duration) time.Duration {
	if left >= 10*time.Second {
		return left * 2 / 5
	}
	return 0
}

func (c *Consumer) msg(raw jetstream.Msg) (*Msg, error) {
	md, err := raw.Metadata()
	if err != nil {
		return nil, err
	}
	job, err := decode(raw.Headers(), raw.Data())
	if err != nil {
		return nil, err
	}
	job.Queue = c.queue
	stored := md.Timestamp
	if v := raw.Headers().Get(hdrStored); v != "" { // moved from a fair queue's backlog
		if ns, err := strconv.ParseInt(v, 10, 64); err == nil {
			stored = time.Unix(0, ns)
		}
	}
	return &Msg{
		Job: job, Delivered: md.NumDelivered, Seq: md.Sequence.Stream, Timestamp: stored,
		raw: raw, nc: c.q.nc, q: c.q,
	}, nil
}

// poison moves an undecodable message to the dead-letter stream, keyed "seq-<stream seq>", and
// terminates it. On failure the message is left to be redelivered.
func (c *Consumer) poison(ctx context.Context, raw jetstream.Msg, cause error) {
	md, err := raw.Metadata()
	if err != nil {
		return
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	id := "seq-" + strconv.FormatUint(md.Sequence.Stream, 10)
	dm := nats.NewMsg(c.q.dlqSubject(c.queue, id))
	for k, v := range raw.Headers() {
		if !strings.HasPrefix(strings.ToLower(k), "nats-") { // no stale Nats-Msg-Id or expectations
			dm.Header[k] = v
		}
	}
	meta := deadMeta{Reason: "undecodable message: " + cause.Error(), Attempts: int(md.NumDelivered),
		FailedAt: c.q.now().UTC(), Seq: md.Sequence.Stream}
	dm.Header.Set(hdrDead, meta.json())
	dm.Data = raw.Data()
	if err := c.q.storeDeadLetter(ctx, c.queue, dm, "dl-"+id); err != nil {
		return
	}
	m := &Msg{raw: raw, nc: c.q.nc}
	_ = m.term(ctx, "undecodable")
}

// Msg is one delivery of a job to a worker. Its methods settle the delivery; after Ack, Nak,
// NakWithDelay or a dead letter, further settling calls return an error. It is safe for
// concurrent use.
type Msg struct {
	// Job is the delivered job, body byte-exact.
	Job *Job
	// Delivered is how many times JetStream has delivered this job, this time included (1 on
	// the first delivery). Delays and pauses that a worker hands back with NakWithDelay count
	// too, so workers that must not spend an attempt on them keep their own count in Status.
	Delivered uint64
	// Seq is the job's sequence number in its queue's stream.
	Seq uint64
	// Timestamp is when the job was stored (in a fair queue: in its tenant's backlog).
	Timestamp time.Time

	raw jetstream.Msg
	nc  *nats.Conn
	q   *core // for the release of the job's tickets when it leaves, and the connection's state (nil: none)

	mu      sync.Mutex
	settled bool
}

// ErrSettled is returned (wrapped) when a settled Msg is settled again.
var ErrSettled = errors.New("queue: message already acknowledged")

// The acknowledgement protocol goes through nats.go where it has the call (Ack, DoubleAck,
// InProgress); nats.go has no confirmed Nak, NakWithDelay or Term, and a hand-back or a
// termination must be known to have reached the server (the job is handed to another worker,
// or leaves the queue), so those three send their acknowledgement as a request and wait for
// the reply (settle).

// Ack acknowledges the job as done, and waits for the server to confirm (nats.go's DoubleAck):
// a nil error means the job is gone from the queue and will not be delivered again.
func (m *Msg) Ack(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.settled {
		return ErrSettled
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	if m.q != nil {
		var stop context.CancelFunc
		ctx, stop = m.q.whileConnected(ctx)
		defer stop()
	}
	if err := m.raw.DoubleAck(ctx); err != nil {
		if errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			return fmt.Errorf("queue: ack job %s: %w", m.id(), ErrSettled)
		}
		return fmt.Errorf("queue: ack job %s: %w", m.id(), err)
	}
	m.settled = true
	m.left()
	return nil
}

// AckNoWait acknowledges the job as done without waiting for the server's confirmation: the
// acknowledgement is queued on the connection and sent with its next flush, which saves the
// round trip of Ack. A nil error means only that it was queued: if it is lost (the connection
// drops before the server has it, the server restarts), JetStream delivers the job again once
// its AckWait has passed. Use it only where such a redelivery is harmless, e.g. after the job's
// final status was recorded, so that whoever receives the job again acks it without working on
// it. After AckNoWait, further settling calls return an error. It does no blocking I/O, so it
// takes no context.
func (m *Msg) AckNoWait() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.settled {
		return ErrSettled
	}
	if err := m.raw.Ack(); err != nil {
		return fmt.Errorf("queue: ack job %s: %w", m.id(), err)
	}
	m.settled = true
	m.left()
	return nil
}

// InProgress tells JetStream the worker is still on the job, restarting its AckWait. It may be
// called any number of times.
func (m *Msg) InProgress(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.settled {
		return ErrSettled
	}
	if err := m.raw.InProgress(); err != nil {
		return fmt.Errorf("queue: in progress job %s: %w", m.id(), err)
	}
	return nil
}

// NakWithDelay hands the job back to be delivered again, to any worker, no sooner than d from
// now. A d <= 0 is Nak.
func (m *Msg) NakWithDelay(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return m.Nak(ctx)
	}
	return m.settle(ctx, fmt.Appendf(nil, `-NAK {"delay": %d}`, d.Nanoseconds()))
}

// Nak hands the job back for immediate redelivery to any worker, as on shutdown.
func (m *Msg) Nak(ctx context.Context) error {
	return m.settle(ctx, []byte("-NAK"))
}

// term terminates the delivery: the job leaves the work-queue stream and is not redelivered.
func (m *Msg) term(ctx context.Context, reason string) error {
	if err := m.settle(ctx, fmt.Appendf(nil, "+TERM %s", reason)); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.left()
	return nil
}

// left releases the tickets of the job, which has left its queue (ledger.go): after its
// acknowledgement, never before, so a crash in between errs toward refusing. m.mu is held.
func (m *Msg) left() {
	if m.q != nil && m.Job != nil {
		m.q.releaseAcked(m.Job.tickets)
	}
}

// settle sends an acknowledgement of kind body and waits for the server's confirmation.
func (m *Msg) settle(ctx context.Context, body []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.settled {
		return ErrSettled
	}
	reply := m.raw.Reply()
	if reply == "" {
		return errors.New("queue: message has no reply subject")
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	if _, err := m.nc.RequestWithContext(ctx, reply, body); err != nil {
		return fmt.Errorf("queue: %s job %s: %w", ackName(body), m.id(), err)
	}
	m.settled = true
	return nil
}

func (m *Msg) id() string {
	if m.Job != nil {
		return m.Job.ID
	}
	return "seq " + strconv.FormatUint(m.Seq, 10)
}

func ackName(body []byte) string {
	if len(body) >= 4 && string(body[:4]) == "-NAK" {
		return "nak"
	}
	return "term"
}
