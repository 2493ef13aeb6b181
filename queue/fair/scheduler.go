package fair

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/queue"
	"github.com/sluice-rl/sluice/retry"
)

const (
	// refreshEvery is how often the leader rereads which tenants have waiting jobs;
	// refreshIdle, how often while it knows of none.
	refreshEvery = 500 * time.Millisecond
	refreshIdle  = 100 * time.Millisecond
	// pollEvery is how often the leader looks at the delivery stream while it is full enough.
	pollEvery = 20 * time.Millisecond
	// fullEvery is how often at least the leader lists the backlog's subjects, though no job
	// arrived since the last listing (refresh).
	fullEvery = 5 * time.Second
	// flushEvery is how often the leader writes the tenants' delivered counts.
	flushEvery = time.Second
	// moveParallel bounds the tenants whose jobs one round moves at once.
	moveParallel = 32
	// opTimeout bounds a round, and the moves a stopping scheduler finishes.
	opTimeout = 5 * time.Second
)

// roundPolicy spaces the tries of a failed round: 100ms doubling to 2s.
var roundPolicy = retry.Policy{Initial: 100 * time.Millisecond, Max: 2 * time.Second, Jitter: -1}

// Source gives a scheduler the layout of its queue; *queue.Queues is one.
type Source interface {
	// FairLayout returns the layout of queue name, or an error wrapping
	// queue.ErrUnknownQueue when name is not provisioned.
	FairLayout(name string) (queue.FairLayout, error)
}

var _ Source = (*queue.Queues)(nil)

// Options configure a Scheduler. The zero value schedules with equal weights, no cap and a
// Target of 1.
type Options struct {
	// Weights maps a tenant (Job.Tenant) to its weight, > 0; a tenant not in it weighs 1.
	// While tenants have jobs waiting, each gets jobs in proportion to its weight.
	Weights map[string]float64
	// TenantRate caps how many jobs per second one tenant's backlog releases; 0: no cap.
	TenantRate float64
	// TenantRates are single tenants' caps, in place of TenantRate (an operator's override,
	// or the rate an adaptive queue learned for the tenant); > 0.
	TenantRates map[string]float64
	// Held reports whether a tenant's jobs are held back now (its upstream paused it): none of
	// them is released while it is. Nil: none is. Called from Run's goroutine, often: it
	// must not block.
	Held func(tenant string) bool
	// Target and TargetUnits bound the lookahead: the jobs the scheduler keeps waiting in the
	// delivery stream, ahead of the workers. Jobs there are served in order, so the time the
	// queue takes to deliver them is the most a newly arrived tenant waits behind others'
	// jobs: set them to a time's worth of the queue's rate and cost_rate (the worker: 250ms).
	// Target is in jobs, >= 1, default 1. TargetUnits is in units (Job.Cost), 0: no bound; a
	// job is moved while fewer units than it wait, so at most TargetUnits plus one job's cost
	// wait.
	Target      int
	TargetUnits int64
	// ByUnits makes the round robin count units instead of jobs: each tenant gets units in
	// proportion to its weight, a job counted at its Job.Cost (0 counts 1).
	ByUnits bool
	// Logger receives the scheduler's logs (leadership changes, failures). Nil: discarded.
	Logger *slog.Logger
	// Drain makes Run return once the backlogs are empty, or when the queue has none: for a
	// queue that was fair and no longer is, whose tenants' jobs still wait.
	Drain bool
}

// Scheduler moves the jobs of one fair queue from its tenants' backlogs to its delivery
// stream, where workers take them as from any queue, in weighted round robin. Any number of
// processes may run one for the same queue; a lease lets one of them work at a time. Create
// it with New and run it with Run; SetOptions and Options are safe to call while it runs.
type Scheduler struct {
	l   queue.FairLayout
	get directGet
	now func() time.Time

	mu   sync.Mutex
	opts Options

	// The leader's state, touched only by Run's goroutine (counts: by its moves too).
	lease     *lease
	picks     picker
	levels    map[string]*levels   // per tenant, its jobs by priority and its starvation guard
	cursor    map[string][3]uint64 // per tenant and level, the backlog sequence its next job is at or after
	counts    counts
	ahead     ahead // jobs moved and not delivered yet, as far as the leader knows
	refreshed time.Time
	readTo    uint64 // the backlog's last sequence in the last reading; 0: unknown
	// fullRead is when the backlog's subjects were last listed, and readWeights the weights
	// given the picker then; stale, whether a move failed since (refresh).
	fullRead    time.Time
	readWeights map[string]float64
	stale       bool
	lastFlush   time.Time
	backlog     jetstream.Stream
	// hold is the backlog's hold consumer (release.go), nil while it has none; heldTo, the
	// last backlog sequence it had delivered when last read (heldBy); holdLooked, when it was last
	// looked for. deleted counts the moved jobs removed by deletion instead.
	hold       jetstream.PushConsumer
	heldTo     atomic.Uint64
	heldMu     sync.Mutex // one reread of heldTo at a time
	holdLooked time.Time
	deleted    atomic.Uint64
	cons       jetstream.Consumer // the workers' consumer, for how many jobs wait for them
	tenantsKV  jetstream.KeyValue
	// costs are the workers' reports of reconciled costs (costs.go), heard by a subscription
	// while Run runs.
	costs reports
}

// New returns the scheduler of fair queue name. It returns an error wrapping
// queue.ErrUnknownQueue when name is not a provisioned fair queue (or, with opts.Drain, not a
// provisioned queue).
func New(src Source, name string, opts Options) (*Scheduler, error) {
	l, err := src.FairLayout(name)
	if err == nil && !l.Fair && !opts.Drain {
		err = fmt.Errorf("%w: %q (not a fair queue)", queue.ErrUnknownQueue, name)
	}
	if err == nil && !l.Fair && !l.HasBacklog {
		// Nothing a fair configuration could have left: no lease, no round, no request.
		err = fmt.Errorf("%w: %q (no backlog stream to drain)", queue.ErrUnknownQueue, name)
	}
	if err != nil {
		return nil, err
	}
	s := &Scheduler{l: l, get: newDirectGet(l.JetStream, l.Backlog), now: time.Now}
	s.forget()
	s.SetOptions(opts)
	return s, nil
}

// SetOptions changes the scheduler's options from its next round on.
func (s *Scheduler) SetOptions(opts Options) {
	opts.Target = max(opts.Target, 1)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s.mu.Lock()
	s.opts = opts
	s.mu.Unlock()
}

// Options returns the scheduler's options, defaults applied.
func (s *Scheduler) Options() Options {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opts
}

// Run schedules the queue until ctx ends: it takes the lease when no other scheduler holds
// it, and while it holds it, keeps Options.Target jobs waiting in the delivery stream, chosen
// from the tenants' backlogs in weighted round robin. Failures are logged and retried. It
// returns nil, after writing the delivered counts and giving the lease up, when ctx ends or
// (Options.Drain) the backlogs are empty.
func (s *Scheduler) Run(ctx context.Context) error {
	if s.Options().Drain {
		if _, err := s.l.JetStream.Stream(ctx, s.l.Backlog); errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil // never fair: nothing to drain
		}
	}
	defer s.stepDown()
	if !s.Options().Drain {
		// Reports of reconciled costs (costs.go): heard always, taken by the leader's rounds.
		if sub, err := s.l.JetStream.Conn().Subscribe(s.l.CostSubject(), s.costs.heard); err == nil {
			defer sub.Unsubscribe()
		} else {
			s.Options().Logger.Warn("fair: reports of reconciled costs not heard", "queue", s.l.Queue, "err", err)
		}
	}
	var renewed time.Time
	backoff := roundPolicy.Backoff(nil)
	for ctx.Err() == nil {
		if s.now().Sub(renewed) >= leaseRenew || !s.leading() {
			s.renew(ctx)
			renewed = s.now()
		}
		if !s.leading() {
			s.costs.take() // the leader's to apply
			sleep(ctx, leaseRenew)
			continue
		}
		moved, err := s.round(ctx)
		if s.Options().Drain && (errors.Is(err, jetstream.ErrStreamNotFound) || err == nil && s.picks.len() == 0) {
			break // nothing (left) to drain
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			wait, _ := backoff.Next(0) // never spent: roundPolicy has no bound
			s.Options().Logger.Warn("fair: scheduler; retrying", "queue", s.l.Queue, "err", err, "retry_in", wait)
			sleep(ctx, wait)
			continue
		}
		backoff.Reset()
		if s.now().Sub(s.lastFlush) >= flushEvery {
			s.flush(ctx)
		}
		if moved == 0 {
			sleep(ctx, s.idle())
		}
	}
	s.flush(context.Background())
	return nil
}

// idle is how long to wait after a round that moved nothing: pollEvery, or until the next
// capped tenant is due if that is sooner (a release polled up to pollEvery late would leave a
// capped tenant well short of its cap).
func (s *Scheduler) idle() time.Duration {
	d := pollEvery
	if due := s.picks.nextDue; !due.IsZero() {
		d = min(d, max(due.Sub(s.now()), time.Millisecond))
	}
	return d
}

func (s *Scheduler) leading() bool { return s.lease != nil && s.lease.held() }

// renew takes, renews or loses the lease, and forgets the leader's state when leadership
// changes: another leader may have changed it meanwhile.
func (s *Scheduler) renew(ctx context.Context) {
	log := s.Options().Logger
	if s.lease == nil {
		kv, err := s.l.JetStream.KeyValue(ctx, s.l.Meta)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("fair: scheduler lease", "queue", s.l.Queue, "err", err)
			}
			return
		}
		s.lease = newLease(kv, s.l.LeaseKey)
	}
	led := s.lease.held()
	if _, err := s.lease.renew(ctx); err != nil && ctx.Err() == nil {
		log.Warn("fair: scheduler lease", "queue", s.l.Queue, "err", err)
	}
	if led != s.lease.held() {
		log.Info("fair: scheduler", "queue", s.l.Queue, "leading", s.lease.held())
		s.forget()
		s.counts.reset()
	}
}

// forget drops the leader's state of the tenants: another leader may have changed it.
func (s *Scheduler) forget() {
	s.picks, s.refreshed, s.readTo, s.stale = picker{}, time.Time{}, 0, false
	s.levels, s.cursor = map[string]*levels{}, map[string][3]uint64{}
	s.ahead = ahead{}
	s.hold, s.holdLooked = nil, time.Time{}
	s.heldTo.Store(0)
	s.costs.take()
}

// stepDown gives the lease up, so that another process takes over at once.
func (s *Scheduler) stepDown() {
	if s.lease != nil {
		s.lease.release(context.Background())
	}
}

// open finds the streams, consumer and bucket the leader works with.
func (s *Scheduler) open(ctx context.Context) error {
	if s.cons != nil {
		return nil
	}
	js := s.l.JetStream
	var err error
	if s.backlog, err = js.Stream(ctx, s.l.Backlog); err != nil {
		return err
	}
	if s.tenantsKV, err = js.KeyValue(ctx, s.l.Tenants); err != nil {
		return err
	}
	s.cons, err = js.Consumer(ctx, s.l.Delivery, s.l.Consumer)
	return err
}

// round tops the delivery stream up to Target jobs and TargetUnits units, and returns how
// many jobs it moved. It counts as waiting there the consumer's pending count or, when larger,
// the jobs it moved that the consumer has not delivered yet (ahead): the count can lag the
// moves by a moment.
func (s *Scheduler) round(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if err := s.open(ctx); err != nil {
		return 0, err
	}
	opts := s.Options()
	s.picks.setByUnits(opts.ByUnits)
	for id, d := range s.costs.take() {
		s.picks.reconcile(id, float64(d))
	}
	if since := s.now().Sub(s.refreshed); since >= refreshEvery || (s.picks.len() == 0 && since >= refreshIdle) {
		if err := s.refresh(ctx, opts); err != nil {
			return 0, err
		}
	}
	if s.picks.len() == 0 {
		return 0, nil
	}
	ci, err := s.cons.Info(ctx)
	if err != nil {
		return 0, err
	}
	jobs, units := s.ahead.waiting(ci.Delivered.Stream, ci.NumPending, s.now(), max(s.picks.quantum, 1))
	b := budget{jobs: opts.Target - jobs, units: math.Inf(1)}
	if opts.TargetUnits > 0 {
		b.units = float64(opts.TargetUnits) - units
	}
	if b.jobs <= 0 || b.units <= 0 {
		return 0, nil
	}
	s.openHold(ctx)
	return s.move(ctx, s.picks.pick(b, opts.TenantRate, s.now(), tenantCaps{rates: opts.TenantRates, held: opts.Held})), nil
}

// refresh rereads which tenants have waiting jobs, and how many of each priority. When no job
// arrived since the last reading (the backlog's last sequence is the same), that reading and
// the moves since still tell every tenant with jobs, so it asks only for the last sequence
// instead of listing the subjects again (10 000 tenants: a listing of 10 000 subjects, twice a
// second, through a drain): unless a move failed since, the weights changed, or the reading is
// fullEvery old.
func (s *Scheduler) refresh(ctx context.Context, opts Options) error {
	if s.readTo != 0 && !s.stale && s.now().Sub(s.fullRead) < fullEvery && maps.Equal(opts.Weights, s.readWeights) {
		si, err := s.backlog.Info(ctx)
		if err != nil {
			return err
		}
		if si.State.LastSeq == s.readTo {
			s.refreshed = s.now()
			return nil
		}
	}
	byLevel, last, err := s.l.LevelDepths(ctx, s.backlog)
	if err != nil {
		return err
	}
	s.refreshed, s.readTo, s.fullRead, s.readWeights, s.stale = s.now(), last, s.now(), opts.Weights, false
	depths := make(map[string]uint64, len(byLevel))
	for id, d := range byLevel {
		depths[id] = d.Sum()
		lv := s.levels[id]
		if lv == nil {
			lv = &levels{}
			s.levels[id] = lv
		}
		lv.set(d)
	}
	s.picks.update(depths, opts.Weights)
	for id := range s.levels {
		if _, ok := depths[id]; !ok {
			delete(s.levels, id)
			delete(s.cursor, id)
		}
	}
	return nil
}

// moved is what moving one tenant's share did.
type moved struct {
	n     int
	seqs  []uint64  // the delivery-stream sequences of the jobs moved
	costs []int64   // their costs (Job.Cost, at least 1), as seqs
	upTo  [3]uint64 // per level, the tenant's backlog is purged below it; 0: nothing was
	empty [3]bool   // per level, fewer jobs were there than asked for
	err   error
}

// move moves the picked jobs, tenants in parallel and each tenant's in order, and returns how
// many it moved. Each tenant's share is split among its priorities (levels.take). The shares
// that are a tenant's one job of a level (levels.single) go together (moveSingles); the others
// tenant by tenant. A tenant found empty gives no more until the next refresh.
func (s *Scheduler) move(ctx context.Context, picks []pickN) int {
	res := make([]moved, len(picks))
	var wg sync.WaitGroup
	sem := make(chan struct{}, moveParallel)
	var singles []single
	for i, p := range picks {
		lv := s.levels[p.tenant]
		if lv == nil {
			continue // not in the last reading
		}
		before := lv.depth
		split := lv.take(p.n)
		if at, ok := lv.single(before, split); ok && s.readTo != 0 {
			singles = append(singles, single{i: i, level: at, subj: s.l.BacklogSubject(p.tenant, queue.Priorities[at])})
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		from := s.cursor[p.tenant]
		go func() {
			defer func() { <-sem; wg.Done() }()
			res[i] = s.moveTenant(ctx, p.tenant, from, split)
		}()
	}
	if len(singles) > 0 {
		s.moveSingles(ctx, singles, res)
	}
	wg.Wait()
	total := 0
	for i, r := range res {
		total += r.n
		s.stale = s.stale || r.err != nil
		if r.err != nil && ctx.Err() == nil {
			s.Options().Logger.Warn("fair: scheduler: move", "queue", s.l.Queue, "tenant", picks[i].tenant, "err", r.err)
		}
		s.moved(picks[i], r)
		s.ahead.add(r.seqs, r.costs, s.now())
	}
	return total
}

// moved records what moving a tenant's share p did.
func (s *Scheduler) moved(p pickN, r moved) {
	id := p.tenant
	s.picks.charge(id, p.units, r.costs)
	lv := s.levels[id]
	if lv == nil {
		s.picks.empty(id)
		return
	}
	cur := s.cursor[id]
	for i := range r.empty {
		if r.empty[i] {
			lv.empty(i)
		}
		if r.upTo[i] != 0 {
			cur[i] = r.upTo[i]
		}
	}
	s.cursor[id] = cur
	if lv.depth.Sum() == 0 {
		s.picks.empty(id)
	}
	s.counts.add(id, r.n)
}

// moveTenant moves split[i] of tenant's oldest jobs of each level i (in the order of queue.Priorities), at or
// after backlog sequence from[i], to the delivery stream: high ones first, then normal, then
// low, so that they are delivered in that order; a level that fails ends the share.
func (s *Scheduler) moveTenant(ctx context.Context, tenant string, from [3]uint64, split [3]int) moved {
	var out moved
	for i, p := range queue.Priorities {
		if split[i] == 0 {
			continue
		}
		r := s.moveLevel(ctx, s.l.BacklogSubject(tenant, p), from[i], split[i])
		out.n += r.n
		out.seqs = append(out.seqs, r.seqs...)
		out.costs = append(out.costs, r.costs...)
		out.upTo[i], out.empty[i] = r.upTo, r.empty
		if r.err != nil {
			out.err = r.err
			break
		}
	}
	return out
}

// levelMoved is what moving one level of a tenant's share did.
type levelMoved struct {
	n     int
	seqs  []uint64 // the delivery-stream sequences of the n jobs moved
	costs []int64  // their costs, as seqs
	upTo  uint64   // the subject is purged below it; 0: nothing was
	empty bool     // fewer jobs were there than asked for
	err   error
}

// moveLevel moves up to n of the oldest jobs on backlog subject subj, at or after backlog
// sequence from, to the delivery stream: they are read from the backlog in one request,
// published to the delivery stream under their own message ids, and removed from the backlog
// once those publishes are acknowledged. A crash in between leaves a job in both; the next
// leader moves it again, and the delivery stream drops the second copy as a duplicate of its
// message id (within Spec.StreamDuplicates).
func (s *Scheduler) moveLevel(ctx context.Context, subj string, from uint64, n int) levelMoved {
	raws, err := s.read(ctx, subj, from, n)
	out := levelMoved{empty: len(raws) < n && err == nil}
	futs, perr := s.forward(raws)
	err = cmp.Or(err, perr)
	// Up to the first job whose copy is not acknowledged, the tenant's jobs are all moved. Once
	// copies are sent, the move is finished even when ctx ends (a scheduler stopping): a job
	// left in both streams would be moved again, and delivered twice after the duplicate window.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	out.seqs, perr = acked(fctx, futs)
	out.n = len(out.seqs)
	out.err = cmp.Or(err, perr)
	out.costs = make([]int64, out.n)
	for i, raw := range raws[:out.n] {
		out.costs[i] = s.l.Cost(raw)
	}
	if out.n > 0 {
		if err := s.remove(fctx, subj, raws[:out.n]); err != nil {
			out.err = cmp.Or(out.err, err) // moved again by a later round, and dropped as duplicates
		} else {
			out.upTo = raws[out.n-1].Sequence + 1
		}
	}
	return out
}

// read reads up to n messages on subj at or after sequence from: one job with the stream's
// own direct get (over the connection's shared reply subscription, no inbox of its own), more
// in one batch.
func (s *Scheduler) read(ctx context.Context, subj string, from uint64, n int) ([]*jetstream.RawStreamMsg, error) {
	if n > 1 {
		return s.get.batch(ctx, subj, from, n)
	}
	raw, err := s.backlog.GetMsg(ctx, from, jetstream.WithGetMsgSubject(subj))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return []*jetstream.RawStreamMsg{raw}, nil
}

// forward publishes the delivery-stream copies of raws, in order, without waiting for their
// acknowledgements; it stops at the first that cannot be sent.
func (s *Scheduler) forward(raws []*jetstream.RawStreamMsg) ([]jetstream.PubAckFuture, error) {
	futs := make([]jetstream.PubAckFuture, 0, len(raws))
	for _, raw := range raws {
		fut, err := s.l.JetStream.PublishMsgAsync(s.l.Forward(raw))
		if err != nil {
			return futs, err
		}
		futs = append(futs, fut)
	}
	return futs, nil
}

// acked waits for futs in order and returns the stream sequences of those acknowledged before
// the first that failed, or ctx ended.
func acked(ctx context.Context, futs []jetstream.PubAckFuture) ([]uint64, error) {
	seqs := make([]uint64, 0, len(futs))
	for _, fut := range futs {
		select {
		case ack := <-fut.Ok():
			seqs = append(seqs, ack.Sequence)
		case err := <-fut.Err():
			return seqs, err
		case <-ctx.Done():
			return seqs, ctx.Err()
		}
	}
	return seqs, nil
}

// flush writes the delivered counts that changed.
func (s *Scheduler) flush(ctx context.Context) {
	s.lastFlush = s.now()
	if s.tenantsKV == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	s.counts.flush(ctx, s.tenantsKV, s.l.CountKey, moveParallel)
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
