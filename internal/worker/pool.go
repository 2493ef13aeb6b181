package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/inflight"
	"github.com/sluice-rl/sluice/internal/tracing"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/queue"
	"github.com/sluice-rl/sluice/retry"
)

// Tuning of the fetch loop and of the calls a worker makes for each job.
const (
	// idleWait is how long a pull request of an empty queue waits at the server for a job
	// (idle.go): an idle queue costs each worker one pull every idleWait.
	idleWait = 30 * time.Second
	// opTimeout bounds each status, ack, nak and dead-letter call.
	opTimeout = 5 * time.Second
	// storeTimeout bounds each call to the leak schedule, so an unreachable store is noticed
	// and retried instead of hanging.
	storeTimeout = time.Second
	// runningAfter is how long the first delivery of a job may run before its attempt is
	// recorded as running; most deliveries end sooner and record only their outcome.
	runningAfter = 100 * time.Millisecond
	// fairAhead is how far ahead of its slots a fair queue's runner holds jobs (see
	// fairLookahead); fairTarget, how far ahead of the workers the scheduler keeps jobs in the
	// delivery stream (its lookahead), as the queue's rate and cost_rate go: 1 to
	// fairTargetMax jobs, and as many units as cost_rate delivers in fairTarget.
	fairAhead     = 50 * time.Millisecond
	fairTarget    = 250 * time.Millisecond
	fairTargetMax = 512
)

// ErrRunning is returned by Run when the Pool is already running or has run.
var ErrRunning = errors.New("worker: pool already ran")

// Deps are what a Pool works with. Queues and Schedule are required.
type Deps struct {
	// Queues is the JetStream layer: consumers, status records, dead letters, scheduled jobs,
	// fair queues' layouts (a *queue.Queues).
	Queues Broker
	// Schedule is the queues' leak schedule, shared by all workers of every process
	// (leaky.NewRedis), or leaky.NewMemory for a single process.
	Schedule leaky.Schedule
	// Places holds the concurrency places of queues with max_in_flight or tenant_in_flight,
	// shared by all workers of every process (inflight.NewRedis on the leak schedule's Redis).
	// Nil: an inflight.NewMemory, for a single process.
	Places inflight.Store
	// HTTP delivers jobs. Nil: the Pool's own, which sends requests to plain http://
	// upstreams that no proxy serves from the job's goroutine (package h1), and the rest
	// through a net/http client (all of them after SetDirectHTTP(false)); both keep up to 64
	// idle connections per host, each for up to 90 s, and follow no redirect. Per-attempt
	// timeouts come from QueueConfig.Timeout; a client's own Timeout applies too.
	HTTP *http.Client
	// Registerer receives the worker's metrics. Nil: they are kept but not registered.
	Registerer prometheus.Registerer
	// Logger receives the worker's logs. Nil: discarded.
	Logger *slog.Logger
	// Regions is this deployment's part in global budgets: the coordinator of the leases of
	// the queues with QueueConfig.Global. Nil: one region.
	Regions *Regions
	// ShutdownTimeout bounds how long Run waits for deliveries in flight once its context is
	// cancelled. Default DefaultShutdownTimeout (10s).
	ShutdownTimeout time.Duration
	// Tracer traces admission and deliveries (trace.go). Nil: tracing off.
	Tracer *tracing.Tracer
}

// Pool drains queues: per queue it holds up to Concurrency jobs, each of which waits for its
// leak slot and is then delivered. Create it with New, start it with Run, change its queues
// with Reload. Its methods are safe for concurrent use.
type Pool struct {
	q     Broker
	pulls pulls // cuts idle queues' waiting pulls short (idle.go)
	// schedules are the queues with a schedule stream, whose due jobs runners move (due.go)
	schedules schedules
	exec      *executor // carries out each job's plan
	// consumer returns the consumer of a queue's priority level (brokerConsumer), and settler
	// what settles a fetched message (the message itself): the worker's own seams, which a
	// test of the pipeline fakes without NATS.
	consumer func(ctx context.Context, name string, p queue.Priority) (consumer, error)
	settler  func(*queue.Msg) message
	sched    leaky.Schedule
	regions  *Regions // nil: one region
	// takes is sched with the slot takes of a queue that overlap in time sharing one call
	// (leaky.Coalesce): an unthrottled drain takes several slots per round trip to Redis.
	takes leaky.Schedule
	// places is Deps.Places with a place released by one delivery given to the next of the
	// same caps in this process (inflight.Reuse), while its cap has room: an uncapped drain
	// under a max_in_flight it does not reach pays a round trip per place per second, not
	// two per job. Run gives the kept places back when it returns.
	places *inflight.Reuser
	client *http.Client
	// direct delivers plain http:// requests in the job's goroutine (client.go); nil for a
	// client of Deps.
	direct *direct
	// ownClient is whether New made client, so Run closes its idle connections at the end.
	ownClient bool
	// spares are the connections client's transport dials ahead; nil for a client of Deps.
	spares   *spares
	log      *slog.Logger
	m        *metrics
	tr       *tracing.Tracer // nil: off
	shutdown time.Duration
	now      func() time.Time
	// runningAfter is how long a first delivery runs before it is recorded as running.
	runningAfter time.Duration
	// suspicion is how long first deliveries read their record after a start or reconnect.
	suspicion func(*QueueConfig) time.Duration

	// controls are the operators' run-time controls of the queues (pause, rate), from the
	// meta bucket; canceled holds the ids of jobs canceled while this pool ran, until
	// pruneCanceled forgets them; inHand, the ids of the jobs in hand.
	controls   atomic.Pointer[map[string]queue.Control]
	handedBack atomic.Int64 // jobs handed back; the shutdown's log line counts its own
	health     scheduleHealth
	canceled   sync.Map // job id -> time.Time it was announced
	inHand     sync.Map // job id -> struct{}

	// bells is the broker's shared streams (shared.go), nil when it has none; idleWait is how
	// long a long pull waits (the const, but in tests).
	bells    sharedBroker
	bellOn   atomic.Bool // the doorbell is subscribed and its first sweep done
	idleWait time.Duration
	// sweepNow asks the sweep to look at once (a reload); formers are the queues' former
	// streams the last sweep found (former.go).
	sweepNow chan struct{}
	formers  atomic.Pointer[map[string][]string]
	swept    startSignal   // the first sweep ended (with or without an error)
	retiring chan struct{} // held by the retirements of former streams under way (former.go)

	mu      sync.Mutex
	specs   []QueueConfig          // the current queues, in order
	runners map[string]*runner     // while running, by queue name
	shared  map[string]QueueConfig // the queues of shared streams, run on demand (shared.go)
	started startSignal            // every runner has its consumer (ready.go)
	ctx     context.Context        // Run's context while running; nil before and after
	hard    context.Context        // cancelled when the shutdown timeout has passed
	wg      sync.WaitGroup         // the runners
	ran     bool
}

// New returns a Pool that drains the queues of specs once Run is called. It returns an error
// when a dependency is missing, a spec is invalid (no name, no rate, a relative URL) or two
// specs have the same name, or when the metrics cannot be registered.
func New(deps Deps, specs []QueueConfig) (*Pool, error) {
	if deps.Queues == nil || deps.Schedule == nil {
		return nil, errors.New("worker: Deps.Queues and Deps.Schedule are required")
	}
	specs, err := prepare(specs, deps.Schedule)
	if err != nil {
		return nil, err
	}
	var fallbacks func() uint64
	if f, ok := deps.Queues.(interface{ ReleaseFallbacks() uint64 }); ok {
		fallbacks = f.ReleaseFallbacks
	}
	m, err := newMetrics(deps.Registerer, fallbacks)
	if err != nil {
		return nil, err
	}
	p := &Pool{
		q:        deps.Queues,
		sched:    deps.Schedule,
		regions:  deps.Regions,
		takes:    leaky.Coalesce(deps.Schedule),
		client:   deps.HTTP,
		log:      deps.Logger,
		m:        m,
		tr:       deps.Tracer,
		shutdown: deps.ShutdownTimeout,
		now:      time.Now,
		specs:    specs,
		runners:  map[string]*runner{},
		shared:   map[string]QueueConfig{},
		idleWait: idleWait,
		sweepNow: make(chan struct{}, 1),
		retiring: make(chan struct{}, formerRetiring),

		runningAfter: runningAfter,
		suspicion:    suspicion,
	}
	if p.log == nil {
		p.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	store := deps.Places
	if store == nil {
		store = inflight.NewMemory()
	}
	p.places = inflight.Reuse(store, 0, 0)
	p.bells, _ = deps.Queues.(sharedBroker)
	p.consumer = brokerConsumer(deps.Queues)
	p.settler = func(m *queue.Msg) message { return m }
	p.exec = &executor{ctx: context.Background(), store: p.q, sched: p.sched, m: m, log: p.log, now: p.now,
		handedBack: func() { p.handedBack.Add(1) }, tenantsPaused: p.tenantsPaused, outbox: newOutbox()}
	if p.client == nil {
		p.client, p.spares, p.direct = defaultClient()
		p.ownClient = true
	}
	if p.shutdown <= 0 {
		p.shutdown = DefaultShutdownTimeout
	}
	return p, nil
}

// prepare validates specs and fills in their defaults.
func prepare(specs []QueueConfig, sched leaky.Schedule) ([]QueueConfig, error) {
	out := make([]QueueConfig, 0, len(specs))
	seen := map[string]bool{}
	var errs []error
	for _, s := range specs {
		if err := errors.Join(s.validate(), s.budgetsKept(sched)); err != nil {
			errs = append(errs, err)
			continue
		}
		if seen[s.Name] {
			errs = append(errs, fmt.Errorf("worker: queue %q: defined twice", s.Name))
			continue
		}
		seen[s.Name] = true
		out = append(out, s)
	}
	return out, errors.Join(errs...)
}

// Queues returns the configs the Pool drains, with defaults filled in.
func (p *Pool) Queues() []QueueConfig {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.specs)
}

// Run drains the queues until ctx is cancelled, then shuts down gracefully: it stops fetching,
// hands back the jobs still waiting for a slot, waits up to Deps.ShutdownTimeout for the
// deliveries in flight, cuts the rest short and hands them back, and returns nil. A Pool runs
// once; a second call returns ErrRunning.
func (p *Pool) Run(ctx context.Context) error {
	// hard ends deliveries in flight once the shutdown timeout has passed; settling ends the
	// calls that settle jobs (status, ack, nak, dead letter, pause) applyGrace after that.
	hard, cancelHard := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHard()
	settling, cancelSettling := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelSettling()
	p.mu.Lock()
	if p.ran {
		p.mu.Unlock()
		return ErrRunning
	}
	p.ran, p.ctx, p.hard, p.exec.ctx = true, ctx, hard, settling
	outboxDone := make(chan struct{})
	go func() { defer close(outboxDone); p.exec.outbox.run(settling, p.q, p.log) }()
	defer func() { cancelSettling(); <-outboxDone }()
	// The controls as they are now, before any runner takes a slot: a worker that starts
	// while an operator has paused its queue must not deliver until the watch catches up.
	cctx, ccancel := context.WithTimeout(ctx, opTimeout)
	if m, err := p.q.Controls(cctx); err == nil {
		p.controls.Store(&m)
	} else {
		p.log.Warn("worker: reading queue controls; the watch will retry", "err", err)
	}
	ccancel()
	for _, s := range p.specs {
		if p.isShared(s.Name) {
			p.shared[s.Name] = s
			continue
		}
		p.startLocked(s)
	}
	watching := p.watch(ctx)
	p.checkStartedLocked()
	p.mu.Unlock()

	<-ctx.Done()
	p.log.Info("worker: shutting down", "timeout", p.shutdown)
	before := p.handedBack.Load() // the log line counts the stop's hand-backs, not the life's
	p.mu.Lock()
	p.ctx = nil
	p.mu.Unlock()
	p.drain(watching, cancelHard, cancelSettling)
	pctx, pcancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
	if err := p.places.Close(pctx); err != nil {
		p.log.Warn("worker: giving back kept concurrency places; they come back after their hold", "err", err)
	}
	pcancel()
	if p.ownClient {
		p.client.CloseIdleConnections()
		p.direct.h1.CloseIdleConnections()
	}
	if p.spares != nil {
		p.spares.close()
	}
	p.log.Info("worker: pool stopped; jobs in hand went back to their queues", "handed_back", p.handedBack.Load()-before)
	return nil
}

// applyGrace is how long after the shutdown timeout the jobs cut short still have to be
// handed back and their status recorded; past it, the calls that settle jobs are abandoned
// (NATS cannot be reached) and the jobs come back after their AckWait.
const applyGrace = time.Second

// drain waits for the runners to finish their jobs in hand, and for the watches to stop: for
// ShutdownTimeout, then, with deliveries cut short (cancelHard), for applyGrace, then, with
// every call that settles a job abandoned (cancelSettling), for the runners only, which then
// return at once. A watch that cannot stop in time (NATS is down) is left to end on its own.
func (p *Pool) drain(watching <-chan struct{}, cancelHard, cancelSettling context.CancelFunc) {
	running := make(chan struct{})
	go func() { p.wg.Wait(); close(running) }()
	cut := time.NewTimer(p.shutdown)
	defer cut.Stop()
	var abandon <-chan time.Time
	for running != nil || watching != nil {
		select {
		case <-running:
			running = nil
		case <-watching:
			watching = nil
		case <-cut.C:
			if running != nil {
				p.log.Warn("worker: shutdown timeout passed; cutting deliveries in flight short")
			}
			cancelHard()
			abandon = time.After(applyGrace)
		case <-abandon:
			p.log.Warn("worker: could not settle every job in time; they return after their AckWait")
			cancelSettling()
			if running != nil {
				<-running
			}
			return
		}
	}
}

// watch follows the operators' controls and cancellations until ctx ends, retrying while NATS
// cannot be reached; the returned channel is closed once it has stopped.
func (p *Pool) watch(ctx context.Context) (stopped <-chan struct{}) {
	var wg sync.WaitGroup
	if p.bells != nil {
		wg.Add(1)
		go func() { defer wg.Done(); p.doorbell(ctx) }()
	}
	wg.Add(6)
	go func() { defer wg.Done(); p.watchPulls(ctx) }()
	go func() { defer wg.Done(); p.watchSchedules(ctx) }()
	go func() { defer wg.Done(); p.sweepLedgers(ctx) }()
	go func() {
		defer wg.Done()
		t := time.NewTicker(cancelMemory / 2)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				p.pruneCanceled(p.now())
			}
		}
	}()
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			err := p.q.WatchControls(ctx, func(m map[string]queue.Control) {
				p.controls.Store(&m)
				p.mu.Lock()
				for _, r := range p.runners {
					for _, pol := range r.pol.all {
						if f, ok := pol.(controlsFollower); ok {
							f.controlsChanged()
						}
					}
				}
				p.mu.Unlock()
			})
			if ctx.Err() == nil {
				p.log.Warn("worker: watching queue controls; retrying", "err", err)
				retry.Sleep(ctx, nil, watchRetry)
			}
		}
	}()
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			err := p.q.WatchCancels(ctx, func(id string) { p.canceled.Store(id, p.now()) })
			if ctx.Err() == nil {
				p.log.Warn("worker: watching cancellations; retrying", "err", err)
				retry.Sleep(ctx, nil, watchRetry)
			}
		}
	}()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	return done
}

// watchRetry is how long a failed watch of the controls or cancellations waits to start again.
const watchRetry = time.Second

// cancelMemory is how long a canceled job's id is remembered when no job of that id is in hand:
// a cancel deletes the job's message before it is announced, so only a job in hand, or one a
// fetch already had on its way, can still come with that id.
const cancelMemory = time.Minute

// pruneCanceled forgets the canceled ids announced more than cancelMemory before now, but for
// those of jobs in hand.
func (p *Pool) pruneCanceled(now time.Time) {
	p.canceled.Range(func(k, v any) bool {
		if _, held := p.inHand.Load(k); !held && now.Sub(v.(time.Time)) > cancelMemory {
			p.canceled.Delete(k)
		}
		return true
	})
}

// tenantsPaused tells the runner of queue the tenants paused now, after this process paused
// one: it holds them back at once rather than at its next read.
func (p *Pool) tenantsPaused(queue string, paused map[string]time.Duration) {
	p.mu.Lock()
	r := p.runners[queue]
	p.mu.Unlock()
	if r == nil {
		return
	}
	for _, pol := range r.pol.all {
		if h, ok := pol.(tenantPauseHearer); ok {
			h.tenantsPaused(p.now(), paused)
		}
	}
}

// tenantPauses returns the Pool's schedule as TenantPauses, or nil when it keeps none.
func (p *Pool) tenantPauses() leaky.TenantPauses {
	tp, _ := p.sched.(leaky.TenantPauses)
	return tp
}

// control returns the operators' control of the queue named name.
func (p *Pool) control(name string) queue.Control {
	if m := p.controls.Load(); m != nil {
		return (*m)[name]
	}
	return queue.Control{}
}

// startLocked starts the runner of queue s; p.mu is held and Run is running.
func (p *Pool) startLocked(s QueueConfig) {
	ctx, cancel := context.WithCancel(p.ctx)
	r := p.newRunner(s, cancel)
	p.runners[s.Name] = r
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		r.run(ctx, p.hard)
	}()
}

// newRunner returns the runner of queue s with its policies, in admission order: its tenant
// not paused, the queue not paused by an operator, its region's share of a global rate, its
// concurrency places, its unit budget, its leak slot, no operator's cancel meanwhile; then the
// learners, the mover and the fair scheduler, which only observe or run.
func (p *Pool) newRunner(s QueueConfig, cancel context.CancelFunc) *runner {
	r := &runner{p: p, name: s.Name, cancel: cancel, wake: make(chan struct{}, 1), shared: p.isShared(s.Name)}
	r.cfg.Store(&s)
	r.reconfigured()
	r.memo.reconnects.Store(p.q.Reconnects())
	r.memo.suspectUntil.Store(p.now().Add(p.suspicion(&s)).UnixNano()) // a start may follow a NATS restart
	env := queueEnv{name: s.Name, cfg: r.cfg.Load, now: p.now, log: p.log, m: p.m,
		control: func() queue.Control { return p.control(s.Name) }, until: r.untilChanged}
	ad, _ := p.sched.(leaky.Adapter)
	learn := &learner{env: env, ad: ad}
	tenantLearn := &tenantLearners{env: env, ad: ad}
	unitLearn := &unitLearner{now: p.now}
	tenants := &tenantPause{env: env, store: p.tenantPauses()}
	operator := &operatorPause{env: env}
	lease := &regionalLease{env: env, reg: p.regions}
	lease.backlog, _ = p.q.(backlogReader)
	slot := &leakSlot{env: env, takes: p.takes, health: &p.health, paused: operator.pausedNow,
		learned: lowest(learn.rate, lease.rate), waiters: &r.slotWaiters, waitUnits: &r.slotUnits, poke: r.poke}
	if p.spares != nil {
		slot.warm = p.spares.warm
	}
	units := newUnitBudget(env, p.sched, slot, unitLearn, lease.fraction, p.exec.ctx)
	units.fairs = p.q
	lease.meanCost = units.meanCost
	r.pol = newPolicies(
		tenants,
		operator,
		lease,
		&places{env: env, store: p.places, settling: p.exec.ctx, health: &p.health},
		units,
		slot,
		&uncanceled{env: env, canceled: &p.canceled},
		learn,
		tenantLearn,
		unitLearn,
		&mover{env: env, mv: p.q, schedules: &p.schedules, cut: p.pulls.current},
		newFairScheduler(env, p.q, tenantLearn, tenants.pausedNow),
	)
	r.pol.tr = p.tr
	return r
}

// Reload replaces the Pool's queues by specs without a restart. The queues present in both
// keep their jobs in hand and take the new settings (rate, burst, attempts, backoff, timeout,
// concurrency, targets) from their next job or slot on; new queues start draining; removed
// queues stop fetching and hand back the jobs waiting for a slot. An invalid spec makes Reload
// return an error and change nothing.
func (p *Pool) Reload(specs []QueueConfig) error {
	specs, err := prepare(specs, p.sched)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.specs = specs
	if p.ctx == nil || p.ctx.Err() != nil {
		return nil
	}
	keep := map[string]bool{}
	clear(p.shared)
	for _, s := range specs {
		keep[s.Name] = true
		shared := p.isShared(s.Name)
		if r, ok := p.runners[s.Name]; ok && r.shared != shared {
			// The queue moved between its own stream and a shared one: its runner's consumer
			// is the old stream's.
			r.cancel()
			delete(p.runners, s.Name)
		}
		if shared {
			p.shared[s.Name] = s
		}
		if r, ok := p.runners[s.Name]; ok {
			r.cfg.Store(&s)
			r.reconfigured()
			r.poke()
			continue
		}
		if !shared {
			p.startLocked(s)
		}
	}
	// The sweep looks at once: for former streams (a queue that moved), and to subscribe
	// the doorbell of the first shared queue.
	select {
	case p.sweepNow <- struct{}{}:
	default:
	}
	for _, name := range slices.Sorted(maps.Keys(p.runners)) {
		if !keep[name] {
			p.runners[name].cancel()
			delete(p.runners, name)
			p.m.drain.forget(name)
		}
	}
	p.log.Info("worker: reloaded", "queues", len(specs))
	return nil
}
