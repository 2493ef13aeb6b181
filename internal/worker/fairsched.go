package worker

import (
	"context"
	"maps"
	"math"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/queue"
	"github.com/sluice-rl/sluice/queue/fair"
)

// fairSource gives a Pool the layouts of its fair queues, to run their schedulers
// (queue.Queues.FairLayout).
type fairSource interface {
	fair.Source
}

// fairScheduler is the policy that runs a fair queue's scheduler (package queue/fair) for as
// long as the queue runs, with the options of the queue's current config, the operators'
// settings of its tenants, their learned rates and their pauses (run). It is idle while the
// queue is not fair, once it has drained what a fair configuration left in the tenants'
// backlogs. Every process runs one; the scheduler's lease lets one of them work at a time.
type fairScheduler struct {
	env   queueEnv
	fairs fairSource // nil: none run (a test's)
	// learned are the tenants' learned rates (tenantLearners); paused, whether a tenant is
	// paused now (tenantPause).
	learned *tenantLearners
	paused  func(tenant string) bool
	// controls is signalled when the operators' controls change, so run applies them at once.
	controls chan struct{}
}

func newFairScheduler(env queueEnv, fairs fairSource, learned *tenantLearners, paused func(string) bool) *fairScheduler {
	return &fairScheduler{env: env, fairs: fairs, learned: learned, paused: paused, controls: make(chan struct{}, 1)}
}

// controlsChanged tells run that the controls changed.
func (fs *fairScheduler) controlsChanged() {
	select {
	case fs.controls <- struct{}{}:
	default:
	}
}

// run runs the scheduler while ctx lasts, following the config every 250ms and at once when
// the controls change.
func (fs *fairScheduler) run(ctx context.Context) {
	if fs.fairs == nil {
		return
	}
	var (
		s        fairRun
		shown    *QueueConfig
		shownCtl map[string]queue.TenantControl
		learned  uint64 // the tenants' learned rates' version shown
		ticker   = time.NewTicker(250 * time.Millisecond)
	)
	defer ticker.Stop()
	defer s.end()
	for {
		cfg, ctl, v := fs.env.cfg(), fs.env.control().Tenants, fs.learned.version.Load()
		fs.follow(ctx, &s, cfg, cfg != shown || !maps.Equal(ctl, shownCtl) || v != learned)
		shown, shownCtl, learned = cfg, ctl, v
		if !cfg.Fair && s.drained {
			// Nothing to schedule (a drain of leftover backlogs runs on its own): wait for the
			// config to change rather than tick.
			if !fs.env.until(ctx) {
				return
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-fs.controls:
		}
	}
}

// fairRun is the scheduler a runner runs for its queue, if any.
type fairRun struct {
	f    *fair.Scheduler
	stop func() // stops f and waits for it
	// drained is whether a drain of leftover backlogs was started since the queue was last
	// fair.
	drained bool
}

// end stops the scheduler, if one runs, and waits for it.
func (s *fairRun) end() {
	if s.stop != nil {
		s.stop()
	}
}

// follow makes s match config cfg, changed since the last call or not: a scheduler while the
// queue is fair, with cfg's options; once it is not, one drain of what its backlogs still hold.
func (fs *fairScheduler) follow(ctx context.Context, s *fairRun, cfg *QueueConfig, changed bool) {
	switch {
	case !cfg.Fair && !s.drained && s.f == nil:
		// Jobs a fair configuration of this queue left in its tenants' backlogs.
		if s.f, _ = fair.New(fs.fairs, fs.env.name, fair.Options{Drain: true, Logger: fs.env.log}); s.f != nil {
			s.stop = runFair(ctx, s.f)
		}
		s.drained = true
	case cfg.Fair && (s.f == nil || s.f.Options().Drain):
		s.end()
		s.stop = nil
		var err error
		if s.f, err = fair.New(fs.fairs, fs.env.name, fs.options(cfg)); err != nil {
			s.f = nil // not provisioned as fair yet: try again at the next tick
			return
		}
		s.stop = runFair(ctx, s.f)
	case !cfg.Fair && s.f != nil && !s.f.Options().Drain:
		s.end()
		s.f, s.stop, s.drained = nil, nil, false
	case s.f != nil && !s.f.Options().Drain && changed:
		s.f.SetOptions(fs.options(cfg))
	}
}

// runFair runs f until ctx ends or the returned function is called, which waits for it.
func runFair(ctx context.Context, f *fair.Scheduler) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	return func() { cancel(); <-done }
}

// options are the scheduler options of config cfg. Its lookahead is fairTarget of the
// queue's rate (1 to fairTargetMax jobs) and, with a unit budget, of its units.
func (fs *fairScheduler) options(cfg *QueueConfig) fair.Options {
	target := math.Ceil(fairTarget.Seconds() / cfg.Rate.Interval.Seconds())
	o := fair.Options{
		Weights:    cfg.Weights,
		TenantRate: cfg.TenantRate,
		Target:     int(min(max(target, 1), fairTargetMax)),
		ByUnits:    cfg.FairByUnits,
		Logger:     fs.env.log,
	}
	if u := cfg.Units; !u.IsZero() {
		o.TargetUnits = max(1, int64(math.Ceil(fairTarget.Seconds()*float64(u.N)/u.Per.Seconds())))
	}
	// Single tenants' caps: an operator's, else the file's; then, on a queue that learns per
	// tenant, what the tenant's upstream takes, as learned (never above its cap).
	o.TenantRates = maps.Clone(cfg.TenantRates)
	ctl := fs.env.control().Tenants
	if len(ctl) > 0 {
		o.Weights = maps.Clone(cfg.Weights)
		if o.Weights == nil {
			o.Weights = map[string]float64{}
		}
		if o.TenantRates == nil {
			o.TenantRates = map[string]float64{}
		}
		for id, tc := range ctl {
			if tc.Weight > 0 {
				o.Weights[id] = tc.Weight
			}
			if rt, err := config.ParseRate(tc.Rate); err == nil && tc.Rate != "" {
				o.TenantRates[id] = rt.PerSecond()
			}
		}
	}
	if learnsPerTenant(cfg) {
		for id, learned := range fs.learned.rates() {
			if o.TenantRates == nil {
				o.TenantRates = map[string]float64{}
			}
			if c, ok := o.TenantRates[id]; !ok || learned < c {
				o.TenantRates[id] = learned
			}
		}
	}
	if cfg.PauseTenant {
		o.Held = fs.paused
	}
	return o
}
