package queue

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// What the ingress reads to estimate when a job will be delivered and to bound what one tenant
// of a fair queue holds: a cheap reading of a queue's backlog (Backlog), where one waiting job
// stands in it (Place), and the operators' control of one queue (Control).

// Backlog is one reading of what waits in a queue.
type Backlog struct {
	// AckFloor is the delivery stream's sequence at and below which every job has left the
	// queue (the shared consumer's ack floor): a job stored at sequence S there has at most
	// S-1-AckFloor jobs before it.
	AckFloor uint64
	// Pending is how many jobs of the delivery stream no worker holds yet, and InFlight how
	// many workers hold (waiting for a slot, or being delivered).
	Pending  uint64
	InFlight int
	// Tenants maps every tenant of a fair queue with jobs in its backlog to how many
	// (Job.Tenant; "" is the unnamed tenant), and Waiting is their sum: jobs not yet moved to
	// the delivery stream. Nil and 0 for a queue that is not fair.
	Tenants map[string]uint64
	Waiting uint64
	// LastSeq is the backlog stream's last sequence in the same reading: Tenants counts every
	// job stored there at or below it (Receipt.Seq), none above.
	LastSeq uint64
}

// Backlog reads what waits in queue name: one request for the consumer's state and, in a fair
// queue, one for the tenants' backlog depths (its answer lists every tenant with jobs waiting,
// a few tens of bytes each). It returns ErrUnknownQueue when name is not provisioned.
func (p Publisher) Backlog(ctx context.Context, name string) (Backlog, error) {
	s, ok := p.spec(name)
	st, sok := p.stream(name)
	if !ok || !sok {
		return Backlog{}, fmt.Errorf("%w: %q", ErrUnknownQueue, name)
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	var out Backlog
	if s.Fair {
		bst, err := p.backlogStream(ctx, name)
		if err != nil {
			return Backlog{}, fmt.Errorf("queue: backlog of %q: %w", name, err)
		}
		if out.Tenants, out.Waiting, out.LastSeq, err = p.layout(name, true).depths(ctx, bst); err != nil {
			return Backlog{}, fmt.Errorf("queue: backlog of %q: %w", name, err)
		}
	}
	if _, shared := p.sharedIndex(name); shared {
		return p.sharedBacklog(ctx, s, st)
	}
	c, err := st.Consumer(ctx, consumerName)
	if err != nil {
		return Backlog{}, fmt.Errorf("queue: backlog of %q: consumer: %w", name, err)
	}
	ci := c.CachedInfo()
	out.AckFloor, out.Pending, out.InFlight = ci.AckFloor.Stream, ci.NumPending, ci.NumAckPending
	return out, nil
}

// backlogStream is the backlog stream of fair queue name, looked up once.
func (q *core) backlogStream(ctx context.Context, name string) (jetstream.Stream, error) {
	if st, ok := q.backlogs.Load(name); ok {
		return st.(jetstream.Stream), nil
	}
	st, err := q.js.Stream(ctx, q.backlogStreamName(name))
	if err != nil {
		return nil, err
	}
	q.backlogs.Store(name, st)
	return st, nil
}

// Place is where one waiting job stands in its queue.
type Place struct {
	// Seq is the job's sequence in its queue's delivery stream, 0 while it waits in its
	// tenant's backlog (a fair queue).
	Seq uint64
	// In a tenant's backlog: BacklogSeq is the job's sequence in the backlog stream, and
	// TenantFirst and TenantLast the sequences of its tenant's oldest and newest waiting jobs
	// of the job's priority there, so that a caller who knows how many jobs the tenant has
	// waiting can tell about how many are before this one (a tenant's jobs of one priority
	// leave in the order they were stored; its high ones before its normal before its low,
	// which this does not weigh).
	BacklogSeq, TenantFirst, TenantLast uint64
}

// Place tells where job st, queued, stands: its sequence in the delivery stream (st.Seq when
// Status read it from there, else one direct get), or, in a fair queue, its place in its
// tenant's backlog (two direct gets). It returns ErrNotFound when the job is in neither: it
// has just been taken, or has left.
func (p Publisher) Place(ctx context.Context, st Status) (Place, error) {
	if st.Seq != 0 {
		return Place{Seq: st.Seq}, nil
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	if stream, ok := p.stream(st.Queue); ok && validID(st.ID) {
		raw, err := stream.GetLastMsgForSubject(ctx, p.jobSubject(st.Queue, st.ID))
		switch {
		case err == nil:
			return Place{Seq: raw.Sequence}, nil
		case !errors.Is(err, jetstream.ErrMsgNotFound):
			return Place{}, fmt.Errorf("queue: place of %s: %w", st.ID, err)
		}
	}
	if st.BacklogSeq == 0 {
		return Place{}, fmt.Errorf("%w: %s is not waiting", ErrNotFound, st.ID)
	}
	bst, err := p.backlogStream(ctx, st.Queue)
	if err != nil {
		return Place{}, fmt.Errorf("queue: place of %s: %w", st.ID, err)
	}
	subj := p.backlogSubject(st.Queue, st.Tenant, st.Priority)
	first, err := bst.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subj))
	if err != nil || first.Sequence > st.BacklogSeq {
		return Place{}, fmt.Errorf("%w: %s is not in its backlog", ErrNotFound, st.ID)
	}
	last, err := bst.GetLastMsgForSubject(ctx, subj)
	if err != nil {
		return Place{}, fmt.Errorf("queue: place of %s: %w", st.ID, err)
	}
	return Place{BacklogSeq: st.BacklogSeq, TenantFirst: first.Sequence, TenantLast: last.Sequence}, nil
}
