package worker

import (
	"context"
	"time"
)

// Runners on demand. A queue of a shared stream (queue.Shareable, with nats.shared_streams
// set) has no runner while it is idle: the pool holds one doorbell per process instead
// (sharedBroker.Doorbell, a subscription to the headers the shared streams republish of every
// job they store), and a bell for a queue without a runner starts one, which makes the
// queue's consumer if it has none yet. A runner whose long pull expired empty (idleWait, 30 s) stops once its
// consumer holds nothing — no job waiting, none unacknowledged (a job handed back with a
// delay, or held by another worker, rings no bell when it comes back) — and no bell rang
// since that pull began (rang). A queue with a schedule stream keeps its runner: the runner
// moves its due jobs.
//
// What rings no bell is found by a sweep (sharedBroker.Waiting) when the doorbell is
// subscribed — the jobs published while no worker ran — and every sweepEvery after: a bell
// lost with the connection or dropped by a subscription that fell behind, a job a crashed
// worker held. So no job waits longer than sweepEvery for a runner, and one on an idle queue
// reaches a worker with the bell: a creation or lookup of its consumer and a pull request.
// Idle, a worker costs the NATS server one subscription and a stream listing per
// sweepEvery, whatever the number of queues.

// sweepEvery is how often a worker looks for shared queues that hold jobs without a runner.
const sweepEvery = 5 * time.Second

// sharedBroker is what a Pool needs of a broker with shared streams (*queue.Queues).
type sharedBroker interface {
	// Shared reports whether a queue keeps its jobs in a shared stream.
	Shared(name string) bool
	// Doorbell calls ring with the queue of every job published to a shared stream, until
	// stop.
	Doorbell(ring func(queue string)) (stop func(), err error)
	// Waiting returns the shared queues that hold jobs, by depth, and by queue the former
	// streams that may hold its jobs (former.go).
	Waiting(ctx context.Context) (waiting map[string]uint64, formers map[string][]string, err error)
	formerSource
}

// idler is a consumer that tells whether it holds any job (queue.Consumer).
type idler interface {
	Idle(ctx context.Context) (bool, error)
}

// isShared reports whether queue name is drained on demand.
func (p *Pool) isShared(name string) bool { return p.bells != nil && p.bells.Shared(name) }

// ring starts the runner of shared queue name unless it runs, and tells a running one that a
// job came (rang).
func (p *Pool) ring(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx == nil || p.ctx.Err() != nil {
		return
	}
	s, ok := p.shared[name]
	if !ok {
		return
	}
	if r := p.runners[name]; r != nil {
		r.rang.Store(true)
		return
	}
	p.startLocked(s)
}

// doorbell holds the pool's doorbell while it has shared queues, and sweeps until ctx ends
// (every sweepEvery, and at once after a reload). It runs whether or not the pool has shared
// queues: the sweep finds the former streams of every queue. The runners make their first
// fetch once the first sweep ended (swept), so that they know their queue's former streams
// from the start; the pool is ready once, in addition, the doorbell is subscribed and a sweep
// found the queues that hold jobs (bellOn).
func (p *Pool) doorbell(ctx context.Context) {
	var stop func()
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		p.mu.Lock()
		hasShared := len(p.shared) > 0
		p.mu.Unlock()
		if hasShared && stop == nil {
			var err error
			if stop, err = p.bells.Doorbell(p.ring); err != nil {
				p.log.Warn("worker: subscribing the doorbell of shared queues; retrying", "err", err)
			}
		}
		err := p.sweep(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			p.log.Warn("worker: looking for queues that hold jobs; retrying", "err", err)
		case err == nil && stop != nil && !p.bellOn.Load():
			p.bellOn.Store(true)
		}
		p.swept.close()
		p.checkStarted()
		wait := t.C
		if hasShared && stop == nil {
			wait = time.After(watchRetry)
		}
		select {
		case <-ctx.Done():
			return
		case <-wait:
		case <-p.sweepNow:
		}
	}
}

// sweep rings for every shared queue that holds jobs (in its current or former streams), every
// shared queue that has a schedule stream (its runner moves the due jobs) or a tenants'
// backlog stream from when it was fair (its runner drains it: fairsched.go), and hands the
// runners their queues' former streams.
func (p *Pool) sweep(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	waiting, formers, err := p.bells.Waiting(sctx)
	if err == nil {
		p.setFormers(formers)
	}
	for name := range waiting {
		p.ring(name)
	}
	for name := range formers {
		p.ring(name)
	}
	p.mu.Lock()
	var scheduled []string
	for name := range p.shared {
		if p.runners[name] == nil && (p.schedules.known(name) || p.hasBacklog(name)) {
			scheduled = append(scheduled, name)
		}
	}
	p.mu.Unlock()
	for _, name := range scheduled {
		p.ring(name)
	}
	return err
}

// stopIdle stops runner r of a shared queue, after a long pull that expired empty, when its
// consumer holds no job, no bell rang since the pull began and its queue has no schedule
// stream: it takes r out of the pool and cancels r's context, which ends its run. It reports
// whether it did.
func (r *runner) stopIdle(ctx context.Context, cons consumer) bool {
	if !r.shared || r.inHand.Load() > 0 || r.p.schedules.known(r.name) || len(r.p.formersOf(r.name)) > 0 {
		return false
	}
	if c, ok := cons.(idler); ok {
		if idle, err := c.Idle(ctx); err != nil || !idle {
			return false
		}
	}
	p := r.p
	p.mu.Lock()
	if r.rang.Load() || p.runners[r.name] != r {
		p.mu.Unlock()
		return false
	}
	delete(p.runners, r.name)
	p.mu.Unlock()
	r.cancel()
	p.log.Debug("worker: shared queue idle; runner stopped", "queue", r.name)
	return true
}

// hasBacklog reports whether queue name has a tenants' backlog stream, from when it was fair.
func (p *Pool) hasBacklog(name string) bool {
	l, err := p.q.FairLayout(name)
	return err == nil && l.HasBacklog
}
