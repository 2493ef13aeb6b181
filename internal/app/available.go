package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/admin"
	"github.com/sluice-rl/sluice/internal/ingress"
	"github.com/sluice-rl/sluice/queue"
)

// errQueuesUnavailable is the answer of lateQueues while it cannot serve: the queues are not
// open yet (NATS has not answered since the start), or JetStream stopped answering for the
// queue. Nothing was stored: the ingress answers 503 (internal/ingress's one place for it).
var errQueuesUnavailable = errors.New("queues unavailable")

// Trials of a queue that is down: the first trialFirst after the failure, then further apart,
// up to trialMax.
const (
	trialFirst = 250 * time.Millisecond
	trialMax   = 5 * time.Second
)

// lateQueues is the queue layer as the ingress's rules, job API and admin API use it: it
// answers at once, and does not keep waiting on a JetStream that does not answer.
//
//   - Until openQueues succeeds (NATS unreachable at start), every call fails at once with
//     errQueuesUnavailable: deferrals and the job API answer 503 in microseconds while the
//     listeners already forward and reject, and /readyz says what it waits for.
//   - Once a publish to a queue failed without an answer from JetStream (its timeout, no
//     responders: a stream leader being elected, a stream whose store failed to write), the
//     queue is "down", as a circuit breaker is open: its publishes fail at once, but one at a
//     time is let through as a trial (trialFirst after the failure, then twice as far apart each
//     time, up to trialMax). A trial that JetStream answers, or a reconnection to NATS (a restarted server),
//     ends the outage. A refusal JetStream answered (full, too large) is not an outage.
//
// Only the publishes caught in flight when JetStream stops answering, and the trials, wait for
// their timeout. Its methods are safe for concurrent use.
type lateQueues struct {
	qs         atomic.Pointer[queue.Queues]
	waiting    atomic.Pointer[string] // why the queues are not open yet
	reconnects func() uint64          // the NATS connection's reconnections so far; nil: none
	log        *slog.Logger

	mu    sync.Mutex
	down  map[string]*outage // by queue
	ndown atomic.Int32       // len(down), so that publishes while no queue is down take no lock
}

// outage is a queue whose JetStream stopped answering.
type outage struct {
	since      time.Time
	err        error  // the last unanswered publish's
	reconnects uint64 // the connection's reconnections when it began
	trial      bool   // a trial publish is in flight
	next       time.Time
	wait       time.Duration // before the trial after next
}

var (
	_ ingress.Enqueuer = (*lateQueues)(nil)
	_ admin.QueueOps   = (*lateQueues)(nil)
	_ admin.QueueInfo  = (*lateQueues)(nil)
)

func newLateQueues(log *slog.Logger) *lateQueues {
	l := &lateQueues{log: log, down: map[string]*outage{}}
	why := "not opened yet"
	l.waiting.Store(&why)
	return l
}

// open makes qs the queue layer every call goes to from now on.
func (l *lateQueues) open(qs *queue.Queues) { l.qs.Store(qs) }

// failed records why opening the queues failed, for ready.
func (l *lateQueues) failed(err error) {
	why := err.Error()
	l.waiting.Store(&why)
}

// get returns the open queues, or errQueuesUnavailable.
func (l *lateQueues) get() (*queue.Queues, error) {
	if qs := l.qs.Load(); qs != nil {
		return qs, nil
	}
	return nil, fmt.Errorf("%w: %s", errQueuesUnavailable, *l.waiting.Load())
}

// Publish implements ingress.Enqueuer: qs.Publish, unless the queues are not open or the job's
// queue is down and this publish is not its trial.
func (l *lateQueues) Publish(ctx context.Context, job *queue.Job) (queue.Receipt, error) {
	qs, err := l.get()
	if err != nil {
		return queue.Receipt{}, err
	}
	trial, err := l.admit(job.Queue)
	if err != nil {
		return queue.Receipt{}, err
	}
	r, err := qs.Publish(ctx, job)
	l.settle(job.Queue, trial, err)
	return r, err
}

// unanswered reports whether a publish failed without an answer from JetStream (a refusal,
// such as a full queue, is an answer).
func unanswered(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case err == nil, errors.Is(err, queue.ErrFull), errors.Is(err, queue.ErrUnknownQueue), errors.Is(err, queue.ErrTooLarge),
		errors.Is(err, queue.ErrIdempotencyMismatch):
		return false
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return true
	case errors.As(err, &apiErr):
		return false
	}
	return true
}

// admit lets a publish to q through (trial: as the trial of its outage), or returns the error
// that refuses it at once.
func (l *lateQueues) admit(q string) (trial bool, err error) {
	if l.ndown.Load() == 0 {
		return false, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	o := l.outage(q)
	if o == nil {
		return false, nil
	}
	if !o.trial && !time.Now().Before(o.next) {
		o.trial = true
		return true, nil
	}
	return false, fmt.Errorf("%w: JetStream has not answered for queue %q since %s: %v", errQueuesUnavailable, q,
		o.since.Format(time.RFC3339), o.err)
}

// outage returns q's outage, nil when it is not down or the connection reconnected since it
// began. l.mu is held.
func (l *lateQueues) outage(q string) *outage {
	o := l.down[q]
	if o != nil && l.reconnects != nil && l.reconnects() != o.reconnects {
		delete(l.down, q)
		l.ndown.Store(int32(len(l.down)))
		l.log.Info("ingress: reconnected to NATS; publishing to the queue again", "queue", q)
		return nil
	}
	return o
}

// settle records how a publish to q (trial: its outage's trial) ended.
func (l *lateQueues) settle(q string, trial bool, err error) {
	if err == nil && l.ndown.Load() == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	o := l.down[q]
	switch {
	case !unanswered(err):
		if o != nil && (trial || err == nil) {
			delete(l.down, q)
			l.ndown.Store(int32(len(l.down)))
			l.log.Info("ingress: JetStream answers for the queue again", "queue", q, "down_for", time.Since(o.since).Round(time.Millisecond))
		}
	case o == nil:
		var rc uint64
		if l.reconnects != nil {
			rc = l.reconnects()
		}
		now := time.Now()
		l.down[q] = &outage{since: now, err: err, reconnects: rc, next: now.Add(trialFirst), wait: 2 * trialFirst}
		l.ndown.Store(int32(len(l.down)))
		l.log.Warn("ingress: JetStream does not answer for the queue; its deferrals answer 503 at once, one at a time tried, until it does",
			"queue", q, "err", err)
	case trial:
		o.err, o.trial = err, false
		o.next, o.wait = time.Now().Add(o.wait), min(2*o.wait, trialMax)
	}
}

// ready is the readiness check "queues": an error while the queues are not open, or while a
// queue is down.
func (l *lateQueues) ready(context.Context) error {
	if _, err := l.get(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	names := make([]string, 0, len(l.down))
	for q := range l.down {
		if l.outage(q) != nil {
			names = append(names, q)
		}
	}
	if len(names) == 0 {
		return nil
	}
	sort.Strings(names)
	o := l.down[names[0]]
	return fmt.Errorf("JetStream does not answer for queue(s) %s since %s (%v): a stream leader "+
		"being elected, or a store that failed to write (nats-server logs \"critical write error\"; "+
		"no space left on device: free space, then restart nats-server)", strings.Join(names, ", "),
		o.since.Format(time.RFC3339), o.err)
}

// Status implements ingress.Enqueuer and admin.QueueOps.
func (l *lateQueues) Status(ctx context.Context, id string) (queue.Status, error) {
	qs, err := l.get()
	if err != nil {
		return queue.Status{}, err
	}
	return qs.Status(ctx, id)
}

// Info implements ingress.Enqueuer and admin.QueueInfo.
func (l *lateQueues) Info(ctx context.Context, name string) (queue.Info, error) {
	qs, err := l.get()
	if err != nil {
		return queue.Info{}, err
	}
	return qs.Info(ctx, name)
}

// Backlog implements ingress.Enqueuer: qs.Backlog, failing at once while the queues are not
// open or q is down (the ingress reads it on the deferral path).
func (l *lateQueues) Backlog(ctx context.Context, q string) (queue.Backlog, error) {
	qs, err := l.get()
	if err != nil {
		return queue.Backlog{}, err
	}
	if l.isDown(q) {
		return queue.Backlog{}, fmt.Errorf("%w: JetStream does not answer for queue %q", errQueuesUnavailable, q)
	}
	return qs.Backlog(ctx, q)
}

// isDown reports whether q is down (see admit).
func (l *lateQueues) isDown(q string) bool {
	if l.ndown.Load() == 0 {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.outage(q) != nil
}

// Place implements ingress.Enqueuer.
func (l *lateQueues) Place(ctx context.Context, st queue.Status) (queue.Place, error) {
	qs, err := l.get()
	if err != nil {
		return queue.Place{}, err
	}
	return qs.Place(ctx, st)
}

// Control is queue.Queues.Control, for the ingress's drain readings.
func (l *lateQueues) Control(ctx context.Context, q string) (queue.Control, error) {
	qs, err := l.get()
	if err != nil {
		return queue.Control{}, err
	}
	return qs.Control(ctx, q)
}

// SetControl implements admin.QueueOps.
func (l *lateQueues) SetControl(ctx context.Context, q string, change func(*queue.Control)) (queue.Control, error) {
	qs, err := l.get()
	if err != nil {
		return queue.Control{}, err
	}
	return qs.SetControl(ctx, q, change)
}

// DeadLetters implements admin.QueueOps.
func (l *lateQueues) DeadLetters(ctx context.Context, q string, limit int) ([]queue.DeadLetter, error) {
	qs, err := l.get()
	if err != nil {
		return nil, err
	}
	return qs.DeadLetters(ctx, q, limit)
}

// Replay implements admin.QueueOps.
func (l *lateQueues) Replay(ctx context.Context, q, id string) error {
	qs, err := l.get()
	if err != nil {
		return err
	}
	return qs.Replay(ctx, q, id)
}

// PurgeDeadLetters implements admin.QueueOps.
func (l *lateQueues) PurgeDeadLetters(ctx context.Context, q string, ids []string) (int, error) {
	qs, err := l.get()
	if err != nil {
		return 0, err
	}
	return qs.PurgeDeadLetters(ctx, q, ids)
}

// Cancel implements admin.QueueOps.
func (l *lateQueues) Cancel(ctx context.Context, id string) (queue.Status, error) {
	qs, err := l.get()
	if err != nil {
		return queue.Status{}, err
	}
	return qs.Cancel(ctx, id)
}

// Controls is queue.Queues.Controls, for the admin API's queue reads.
func (l *lateQueues) Controls(ctx context.Context) (map[string]queue.Control, error) {
	qs, err := l.get()
	if err != nil {
		return nil, err
	}
	return qs.Controls(ctx)
}

// TenantID is queue.Queues.TenantID, for the ingress's tenants and the admin API's tenant
// reads: errQueuesUnavailable until the queues open, since the id secret may be the one kept in
// JetStream.
func (l *lateQueues) TenantID(key []byte) (string, error) {
	qs, err := l.get()
	if err != nil {
		return "", err
	}
	return qs.TenantID(key), nil
}

// Tenant is queue.Queues.Tenant, for the admin API's tenant reads.
func (l *lateQueues) Tenant(ctx context.Context, q, tenant string) (queue.TenantInfo, error) {
	qs, err := l.get()
	if err != nil {
		return queue.TenantInfo{}, err
	}
	return qs.Tenant(ctx, q, tenant)
}

// jetStreamCheck is the readiness check "jetstream": whether JetStream answers for the
// account, and then more (the queues' own state). nats-server disables JetStream when it
// cannot write its store (no space left on device) and enables it only when restarted, so the
// check says so.
func jetStreamCheck(js jetstream.JetStream, more func(context.Context) error) admin.Check {
	return admin.Check{Name: "jetstream", Func: func(ctx context.Context) error {
		_, err := js.AccountInfo(ctx)
		if errors.Is(err, jetstream.ErrJetStreamNotEnabled) {
			return fmt.Errorf("%w: nats-server disables JetStream when it cannot write its store "+
				"(no space left on device?): free space, then restart nats-server", err)
		}
		if more != nil {
			if merr := more(ctx); merr != nil {
				return merr
			}
		}
		return err
	}}
}

// redactURL is a nats url (servers separated by commas) without passwords, for logs.
func redactURL(raw string) string {
	parts := strings.Split(raw, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if u, err := url.Parse(p); err == nil && u.User != nil {
			u.User = url.User("redacted")
			p = u.String()
		}
		parts[i] = p
	}
	return strings.Join(parts, ",")
}
