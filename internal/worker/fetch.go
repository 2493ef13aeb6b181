package worker

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/queue"
	"github.com/sluice-rl/sluice/retry"
)

// The waits of a runner's retries: after a failed fetch, while its queue's consumer does not
// exist yet (the ingress or another worker may be about to provision it), and while the leak
// schedule cannot be reached.
var (
	fetchBackoff    = retry.Policy{Initial: 100 * time.Millisecond, Max: 2 * time.Second}
	consumerBackoff = retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}
	// probeBackoff spaces the probes of an unreachable leak schedule.
	probeBackoff = retry.Policy{Initial: 100 * time.Millisecond, Max: time.Second}
)

// run fetches jobs while ctx lasts, keeping at most Concurrency in hand, and returns when
// every job it fetched is finished.
//
// While some jobs in hand still wait for their leak slot, the next slots are taken care of,
// and run fetches only once a quarter of Concurrency is free (fetchBatch), not after every
// finished job: each fetch costs a subscription and a pull request at the NATS server, which
// at a rate of thousands per second is as much as the rest of the job's round trips. When no
// job waits for a slot (a slow upstream, not the rate, is what holds the queue back), it
// fetches for every free place at once, so that Concurrency deliveries stay in flight.
func (r *runner) run(ctx, hard context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, l := range r.pol.loops {
		wg.Add(1)
		go func() { defer wg.Done(); l.run(ctx) }()
	}
	cons := r.firstConsumer(ctx)
	if cons == nil {
		return
	}
	r.fetching.Store(true)
	r.p.checkStarted()
	fetchWait, probeWait := fetchBackoff.Backoff(nil), probeBackoff.Backoff(nil)
	idle := make(chan *queue.Msg) // handlers done with a job, waiting for the next
	for ctx.Err() == nil {
		if r.p.health.err() != nil {
			// The leak schedule cannot be reached: fetch nothing (other workers may reach it)
			// until it answers.
			if !r.probe(ctx) {
				_ = probeWait.Wait(ctx, 0)
				continue
			}
			probeWait.Reset()
		}
		cfg := r.cfg.Load()
		n := cfg.Concurrency - int(r.inHand.Load())
		if cfg.Fair {
			// Jobs in hand are served before whatever the scheduler chooses next.
			n = min(n, r.fairLookahead(cfg))
		}
		if !r.fetchDue(cfg, n) {
			select {
			case <-r.wake:
			case <-ctx.Done():
			}
			continue
		}
		msgs, err := r.fetch(ctx, cons, n)
		if err != nil && len(msgs) == 0 {
			if cons = r.fetchFailed(ctx, cons, err, fetchWait.Next); cons == nil {
				break
			}
			continue
		}
		fetchWait.Reset()
		r.readRecords(ctx, cfg, msgs)
		for _, m := range msgs {
			if m.Job != nil {
				r.fs.lastCost = max(m.Job.Cost, 1)
			}
			r.inHand.Add(1)
			r.p.m.inFlight.WithLabelValues(r.name).Inc()
			if m.Job != nil {
				r.p.inHand.Store(m.Job.ID, struct{}{})
			}
			select {
			case idle <- m:
			default:
				wg.Add(1)
				go func() { defer wg.Done(); r.handler(ctx, hard, m, idle) }()
			}
		}
	}
}

// handlerIdle is how long a handler goroutine waits for another job before it ends.
const handlerIdle = time.Second

// handler handles m, then every job run hands it while it waits (idle), until ctx ends or no
// job comes for handlerIdle. A goroutine per job started each one on a small stack that grew
// by copying, deep in the HTTP, Redis and NATS clients: 3% of an unthrottled worker's CPU.
func (r *runner) handler(ctx, hard context.Context, m *queue.Msg, idle <-chan *queue.Msg) {
	t := time.NewTimer(handlerIdle)
	defer t.Stop()
	for {
		r.handleOne(ctx, hard, m)
		t.Reset(handlerIdle)
		select {
		case m = <-idle:
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// handleOne handles m and gives its place back (free), when handle did not already.
func (r *runner) handleOne(ctx, hard context.Context, m *queue.Msg) {
	if m.Job != nil {
		defer r.p.inHand.Delete(m.Job.ID)
	}
	defer r.memo.recalled.Delete(m) // when recall did not look
	var once sync.Once
	free := func() {
		once.Do(func() {
			left := r.inHand.Add(-1)
			r.p.m.inFlight.WithLabelValues(r.name).Dec()
			r.freed(left)
		})
	}
	r.handle(ctx, hard, m, free)
	free()
}

// fairLookahead is how many more jobs of a fair queue the runner may fetch to wait for their
// slots: up to the jobs of fairAhead (a twentieth of a second) at the queue's rate, at least 1
// — enough for the slots to follow each other, few enough that a newly arrived tenant waits
// behind little. With a unit budget, the units waiting are bounded the same way: jobs while
// fewer units wait than cost_rate delivers in fairAhead, each estimated at the last job
// fetched's cost (the last may take more than is left), and one when none waits.
func (r *runner) fairLookahead(cfg *QueueConfig) int {
	n := max(1, int(math.Ceil(fairAhead.Seconds()/cfg.Rate.Interval.Seconds()))) - int(r.slotWaiters.Load())
	if u := cfg.Units; !u.IsZero() && n > 0 {
		waiting := r.slotUnits.Load()
		room := fairAhead.Seconds()*float64(u.N)/u.Per.Seconds() - float64(waiting)
		if waiting > 0 && room <= 0 {
			return 0
		}
		n = min(n, max(1, int(math.Ceil(room/float64(max(r.fs.lastCost, 1))))))
	}
	return n
}

// fetchDue reports whether the fetch loop fetches with n places free: when n > 0, and for a
// queue that is not fair, once n reaches fetchBatch or no job in hand waits for its slot.
func (r *runner) fetchDue(cfg *QueueConfig, n int) bool {
	return n > 0 && (cfg.Fair || n >= fetchBatch(cfg.Concurrency) || r.slotWaiters.Load() == 0)
}

// freed is called when a job in hand has finished, inHand the jobs still in hand: it wakes
// the fetch loop when that may now fetch (fetchDue) or must probe the schedule, and not
// otherwise: at thousands of jobs a second a wake-up per finished job, to find less than a
// batch free, cost a goroutine's (and, in an idle process, a thread's) wake-up each.
func (r *runner) freed(inHand int64) {
	cfg := r.cfg.Load()
	if r.fetchDue(cfg, cfg.Concurrency-int(inHand)) || r.p.health.err() != nil {
		r.poke()
	}
}

// fetchBatch is the fewest free places in hand a runner fetches for, at concurrency c: a
// quarter of c, at least 1.
func fetchBatch(c int) int { return max(1, c/4) }

// fetch returns up to n jobs: those available now, or else the first to arrive within
// idleWait (a waiting fetch of n would hold the first job until n had arrived or the wait
// ended). The fetch of the jobs available now is not cancelled with ctx: cancelling it could
// strand a job the server had already sent until its AckWait passed; jobs fetched after ctx
// ended are handed back at once by handle instead. The long pull of an idle queue is
// cancelled, by ctx and by the pool's pulls (idle.go): it would otherwise hold a shutdown for
// idleWait, and stay lost with a server that forgot it.
//
// A queue's jobs of priority high and low come from their own consumers (levels), the
// higher level first (priority.go); an idle queue's long pull waits on every level at once.
// The jobs still in the queue's former streams come before all of them (former.go).
func (r *runner) fetch(ctx context.Context, cons consumer, n int) ([]*queue.Msg, error) {
	if msgs := r.fromFormers(ctx, n); len(msgs) > 0 {
		return msgs, nil
	}
	fctx := context.WithoutCancel(ctx)
	lv := r.levelsOf(ctx, cons)
	var (
		msgs []*queue.Msg
		err  error
	)
	switch {
	case r.fs.idle:
		// The last long pull found nothing: no job came since, or it would have had it.
	case lv != nil:
		msgs, err = lv.take(fctx, n, r.p.now())
	default:
		msgs, err = cons.Fetch(fctx, n, 0)
	}
	if len(msgs) > 0 || err != nil || ctx.Err() != nil {
		return msgs, err
	}
	r.fs.idle = false
	r.rang.Store(false) // a bell from now on is for a job this pull may miss (stopIdle)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(r.p.pulls.current(), cancel)()
	r.pullCut.Store(&cancel)
	defer r.pullCut.Store(nil)
	wait := r.p.idleWait
	if len(r.p.formersOf(r.name)) > 0 {
		wait = formerRetry // back soon to the former streams: to retire them, or for a job handed back
	}
	if lv != nil {
		msgs, err = lv.wait(lctx, cancel, wait)
	} else {
		msgs, err = cons.Fetch(lctx, 1, wait)
	}
	if err != nil && lctx.Err() != nil {
		return msgs, nil // cut short: the caller pulls again, or stops
	}
	r.fs.idle = len(msgs) == 0 && err == nil && lctx.Err() == nil
	if r.fs.idle {
		r.stopIdle(ctx, cons) // a shared queue's runner stops: ctx ends, and run with it
	}
	return msgs, err
}

// fetchFailed answers a fetch that failed with err and no job: it waits for the next try
// (next, the fetch's backoff), or gets the consumer again when it is gone, and returns the
// consumer to fetch from; nil when ctx ended.
func (r *runner) fetchFailed(ctx context.Context, cons consumer, err error, next func(time.Duration) (time.Duration, bool)) consumer {
	if ctx.Err() != nil {
		return nil
	}
	if errors.Is(err, queue.ErrConsumerGone) {
		return r.consumerAgain(ctx, err)
	}
	wait, _ := next(0)
	r.p.log.Warn("worker: fetch failed", "queue", r.name, "err", err, "retry_in", wait)
	_ = retry.Sleep(ctx, nil, wait)
	return cons
}

// firstConsumer returns the queue's consumer once the runner may make its first fetch: when
// the pool sweeps, after its first sweep, which tells the queue's former streams, whose jobs
// go first (former.go), unless no queue can have one (no shared stream existed at the last
// Provision: formersPossible). A shared queue with former streams gets its consumer at its first
// fetch from its current stream (lazyConsumer), once the former streams had nothing to give:
// a migration of thousands of queues then does not make thousands of consumers while it
// drains. Nil when ctx ends first.
func (r *runner) firstConsumer(ctx context.Context) consumer {
	if r.p.bells != nil && r.p.formersPossible() {
		select {
		case <-r.p.swept.ch():
		case <-ctx.Done():
			return nil
		}
		if r.shared && len(r.p.formersOf(r.name)) > 0 {
			return &lazyConsumer{r: r, ctx: ctx}
		}
	}
	return r.consumer(ctx)
}

// lazyConsumer is a runner's consumer got at its first fetch (firstConsumer), under the
// runner's ctx.
type lazyConsumer struct {
	r   *runner
	ctx context.Context
	c   consumer
}

func (l *lazyConsumer) Fetch(ctx context.Context, n int, wait time.Duration) ([]*queue.Msg, error) {
	if l.c == nil {
		if l.c = l.r.consumer(l.ctx); l.c == nil {
			return nil, l.ctx.Err()
		}
	}
	return l.c.Fetch(ctx, n, wait)
}

// Idle is the consumer's (queue.Consumer.Idle); true before the first fetch.
func (l *lazyConsumer) Idle(ctx context.Context) (bool, error) {
	if i, ok := l.c.(idler); ok {
		return i.Idle(ctx)
	}
	return true, nil
}

// consumerAgain returns the queue's consumer after a fetch found it gone (err): deleted (a
// shared queue's, idle for queue.SharedInactive) or its stream retired; it is made again
// where the queue's stream is now. Nil when ctx ends first.
func (r *runner) consumerAgain(ctx context.Context, err error) consumer {
	r.p.log.Info("worker: queue consumer gone; getting it again", "queue", r.name, "err", err)
	r.fs.lv = nil
	return r.consumer(ctx)
}

// consumer returns the queue's consumer, retrying while the queue does not exist yet (the
// ingress or another worker may be about to provision it); nil when ctx ends first.
func (r *runner) consumer(ctx context.Context) consumer {
	warned := false
	b := consumerBackoff.Backoff(nil)
	for {
		c, err := r.p.consumer(ctx, r.name, queue.PriorityNormal)
		if err == nil {
			return c
		}
		if ctx.Err() != nil {
			return nil
		}
		if !warned {
			r.p.log.Warn("worker: queue consumer unavailable; retrying", "queue", r.name, "err", err)
			warned = true
		}
		if b.Wait(ctx, 0) != nil {
			return nil
		}
	}
}

// probe asks the leak schedule whether it answers again (a read, PausedFor), and records the
// answer.
func (r *runner) probe(ctx context.Context) bool {
	pctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	if _, err := r.p.sched.PausedFor(pctx, r.name); err != nil {
		return false
	}
	r.p.health.up(r.p.log)
	return true
}
