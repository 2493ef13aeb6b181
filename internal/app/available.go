package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/admin"
	"github.com/sluice-rl/sluice/internal/ingress"
	"github.com/sluice-rl/sluice/queue"
)

// errQueuesUnavailable is the answer of lateQueues while it cannot serve: the queues are not
// open yet (NATS has not answered since the start), or JetStream stopped answering for the
// queue. Nothing was stored: the ingress answers 503 (internal/ingress's one place for it).
var errQueuesUnavailable = errors.New("queues unavailable")

// lateQueues is the queue layer as the ingress's rules, job API and admin API use it: it
// answers at once, and does not keep waiting on a JetStream that does not answer.
//
//   - Until openQueues succeeds (NATS unreachable at start), every call fails at once with
//     errQueuesUnavailable: deferrals and the job API answer 503 in microseconds while the
//     listeners already forward and reject, and /readyz says what it waits for.
//   - Publishes, and the backlog reads of the deferral path, go through a breaker per queue:
//     while JetStream does not answer for a queue they fail at once, but for a trial now and
//     then (see breaker).
//
// Only the publishes caught in flight when JetStream stops answering, and the trials, wait for
// their timeout. Its methods are safe for concurrent use.
type lateQueues struct {
	qs      atomic.Pointer[queue.Queues]
	waiting atomic.Pointer[string] // why the queues are not open yet
	breaker *breaker
}

var (
	_ ingress.Enqueuer = (*lateQueues)(nil)
	_ admin.QueueOps   = (*lateQueues)(nil)
	_ admin.QueueInfo  = (*lateQueues)(nil)
	_ admin.JobBrowser = (*lateQueues)(nil)
)

func newLateQueues(log *slog.Logger) *lateQueues {
	l := &lateQueues{breaker: newBreaker(nil, log)}
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

// withQueues returns f of the open queues, or errQueuesUnavailable while they are not open.
func withQueues[T any](l *lateQueues, f func(*queue.Queues) (T, error)) (T, error) {
	qs, err := l.get()
	if err != nil {
		var zero T
		return zero, err
	}
	return f(qs)
}

// Publish implements ingress.Enqueuer: qs.Publish, unless the queues are not open or the job's
// queue is down and this publish is not its trial.
func (l *lateQueues) Publish(ctx context.Context, job *queue.Job) (queue.Receipt, error) {
	qs, err := l.get()
	if err != nil {
		return queue.Receipt{}, err
	}
	trial, err := l.breaker.admit(job.Queue)
	if err != nil {
		return queue.Receipt{}, err
	}
	r, err := qs.Publish(ctx, job)
	l.breaker.settle(job.Queue, trial, err)
	return r, err
}

// Backlog implements ingress.Enqueuer: qs.Backlog, failing at once while the queues are not
// open or q is down (the ingress reads it on the deferral path).
func (l *lateQueues) Backlog(ctx context.Context, q string) (queue.Backlog, error) {
	return withQueues(l, func(qs *queue.Queues) (queue.Backlog, error) {
		if l.breaker.isDown(q) {
			return queue.Backlog{}, fmt.Errorf("%w: JetStream does not answer for queue %q", errQueuesUnavailable, q)
		}
		return qs.Backlog(ctx, q)
	})
}

// ready is the readiness check "queues": an error while the queues are not open, or while a
// queue is down.
func (l *lateQueues) ready(context.Context) error {
	if _, err := l.get(); err != nil {
		return err
	}
	return l.breaker.ready()
}

// TenantID is queue.IDs.TenantID, for the ingress's tenants and the admin API's tenant
// reads: errQueuesUnavailable until the queues open, since the id secret may be the one kept in
// JetStream.
func (l *lateQueues) TenantID(key []byte) (string, error) {
	return withQueues(l, func(qs *queue.Queues) (string, error) { return qs.TenantID(key), nil })
}

// The rest are the queue layer's methods, once it is open: for the ingress (Enqueuer: Status,
// Info, Place; Control for its drain readings) and the admin API (QueueOps, QueueInfo,
// JobBrowser; Controls and Tenant for its queue reads).

func (l *lateQueues) Status(ctx context.Context, id string) (queue.Status, error) {
	return withQueues(l, func(qs *queue.Queues) (queue.Status, error) { return qs.Status(ctx, id) })
}

func (l *lateQueues) Info(ctx context.Context, name string) (queue.Info, error) {
	return withQueues(l, func(qs *queue.Queues) (queue.Info, error) { return qs.Info(ctx, name) })
}

func (l *lateQueues) Place(ctx context.Context, st queue.Status) (queue.Place, error) {
	return withQueues(l, func(qs *queue.Queues) (queue.Place, error) { return qs.Place(ctx, st) })
}

func (l *lateQueues) Control(ctx context.Context, q string) (queue.Control, error) {
	return withQueues(l, func(qs *queue.Queues) (queue.Control, error) { return qs.Control(ctx, q) })
}

func (l *lateQueues) Controls(ctx context.Context) (map[string]queue.Control, error) {
	return withQueues(l, func(qs *queue.Queues) (map[string]queue.Control, error) { return qs.Controls(ctx) })
}

func (l *lateQueues) QueueControls(ctx context.Context) (map[string]queue.Control, error) {
	return withQueues(l, func(qs *queue.Queues) (map[string]queue.Control, error) { return qs.QueueControls(ctx) })
}

func (l *lateQueues) TenantCounts(ctx context.Context) (map[string]int, error) {
	return withQueues(l, func(qs *queue.Queues) (map[string]int, error) { return qs.TenantCounts(ctx) })
}

func (l *lateQueues) TenantControl(ctx context.Context, q, tenant string) (queue.TenantControl, bool, error) {
	type found struct {
		tc queue.TenantControl
		ok bool
	}
	f, err := withQueues(l, func(qs *queue.Queues) (found, error) {
		tc, ok, err := qs.TenantControl(ctx, q, tenant)
		return found{tc, ok}, err
	})
	return f.tc, f.ok, err
}

func (l *lateQueues) SetTenantControl(ctx context.Context, q, tenant string, max int, change func(*queue.TenantControl)) (queue.TenantControl, error) {
	return withQueues(l, func(qs *queue.Queues) (queue.TenantControl, error) {
		return qs.SetTenantControl(ctx, q, tenant, max, change)
	})
}

func (l *lateQueues) SetControl(ctx context.Context, q string, change func(*queue.Control)) (queue.Control, error) {
	return withQueues(l, func(qs *queue.Queues) (queue.Control, error) { return qs.SetControl(ctx, q, change) })
}

func (l *lateQueues) Cancel(ctx context.Context, id string) (queue.Status, error) {
	return withQueues(l, func(qs *queue.Queues) (queue.Status, error) { return qs.Cancel(ctx, id) })
}

func (l *lateQueues) DeadLetters(ctx context.Context, q string, limit int) ([]queue.DeadLetter, error) {
	return withQueues(l, func(qs *queue.Queues) ([]queue.DeadLetter, error) { return qs.DeadLetters(ctx, q, limit) })
}

func (l *lateQueues) Replay(ctx context.Context, q, id string) error {
	qs, err := l.get()
	if err != nil {
		return err
	}
	return qs.Replay(ctx, q, id)
}

func (l *lateQueues) PurgeDeadLetters(ctx context.Context, q string, ids []string) (int, error) {
	return withQueues(l, func(qs *queue.Queues) (int, error) { return qs.PurgeDeadLetters(ctx, q, ids) })
}

func (l *lateQueues) Tenant(ctx context.Context, q, tenant string) (queue.TenantInfo, error) {
	return withQueues(l, func(qs *queue.Queues) (queue.TenantInfo, error) { return qs.Tenant(ctx, q, tenant) })
}

func (l *lateQueues) Browse(ctx context.Context, q string, bq queue.BrowseQuery) (queue.Page, error) {
	return withQueues(l, func(qs *queue.Queues) (queue.Page, error) { return qs.Browse(ctx, q, bq) })
}

// jetStreamCheck is the readiness check "jetstream": whether JetStream answers for the
// account, and then more (the queues' own state). A clustered nats-server disables JetStream
// when it cannot write its store (no space left on device) and enables it only when
// restarted, so the check says so; without a JetStream domain, a leaf node without JetStream
// of its own answers the same, so the check names nats.jetstream_domain too. (A lone server keeps JetStream on and fails only the
// streams that could not write: more, the breaker's readiness, names those.)
func jetStreamCheck(js jetstream.JetStream, more func(context.Context) error) admin.Check {
	return admin.Check{Name: "jetstream", Func: func(ctx context.Context) error {
		_, err := js.AccountInfo(ctx)
		if errors.Is(err, jetstream.ErrJetStreamNotEnabled) {
			if js.Options().Domain == "" {
				// The same answer as a leaf node that runs no JetStream of its own gives.
				return fmt.Errorf("%w: nats-server disables JetStream when it cannot write its store "+
					"(no space left on device?): free space, then restart nats-server; or the server runs no JetStream: "+
					"start it with -js or, when it is a leaf node of the servers that hold the queues, "+
					"set nats.jetstream_domain to their JetStream domain", err)
			}
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
