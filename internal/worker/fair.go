package worker

import (
	"context"
	"math"
	"time"

	"github.com/sluice-rl/sluice/queue/fair"
)

// fairSource gives a Pool the layouts of its fair queues, to run their schedulers;
// *queue.Queues is one. A Broker that is not one (a test's fake) runs no schedulers.
type fairSource interface {
	fair.Source
}

// scheduleLoop runs the scheduler of a fair queue while ctx lasts, with the options of the
// runner's current config; it is idle while the queue is not fair. Every process runs one;
// the scheduler's lease lets one of them work at a time.
func (r *runner) scheduleLoop(ctx context.Context) {
	if r.p.fairs == nil {
		return
	}
	var (
		f     *fair.Scheduler
		stop  func() // stops f and waits for it
		shown *QueueConfig
		// drained is whether a drain of leftover backlogs was started since the queue was
		// last fair.
		drained bool
		ticker  = time.NewTicker(250 * time.Millisecond)
	)
	defer ticker.Stop()
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	for {
		cfg := r.cfg.Load()
		switch {
		case !cfg.Fair && !drained && f == nil:
			// Jobs a fair configuration of this queue left in its tenants' backlogs.
			if f, _ = fair.New(r.p.fairs, r.name, fair.Options{Drain: true, Logger: r.p.log}); f != nil {
				stop = runFair(ctx, f)
			}
			drained = true
		case cfg.Fair && (f == nil || f.Options().Drain):
			if stop != nil {
				stop()
				stop = nil
			}
			var err error
			if f, err = fair.New(r.p.fairs, r.name, fairOptions(cfg, r)); err != nil {
				f = nil // not provisioned as fair yet: try again at the next tick
				break
			}
			stop = runFair(ctx, f)
		case !cfg.Fair && f != nil && !f.Options().Drain:
			stop()
			f, stop, drained = nil, nil, false
		case f != nil && !f.Options().Drain && cfg != shown:
			f.SetOptions(fairOptions(cfg, r))
		}
		shown = cfg
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// runFair runs f until ctx ends or the returned function is called, which waits for it.
func runFair(ctx context.Context, f *fair.Scheduler) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	return func() { cancel(); <-done }
}

// fairOptions are the scheduler options of config cfg.
func fairOptions(cfg *QueueConfig, r *runner) fair.Options {
	target := math.Ceil(fairTarget.Seconds() / cfg.Rate.Interval.Seconds())
	return fair.Options{
		Weights:    cfg.Weights,
		TenantRate: cfg.TenantRate,
		Target:     int(min(max(target, 2), fairTargetMax)),
		Logger:     r.p.log,
	}
}
