package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/retry"
)

// leakSlot is the policy of a queue's leak slot: a job goes at its slot of the queue's rate,
// shared by every worker of every process (leaky.Schedule). It also says whether the queue's
// deliveries are paced by that rate (observe sets job.gather; see applyTick). Safe for
// concurrent use.
type leakSlot struct {
	env queueEnv
	// takes is the Pool's schedule with the takes of a queue that overlap in time sharing one
	// call (leaky.Coalesce).
	takes  leaky.Schedule
	health *scheduleHealth
	// paused is the operator's pause, checked again just before each slot; learned, the
	// queue's learned rate in deliveries per second (0: none).
	paused  func() bool
	learned func() float64
	// warm dials a connection to the upstream ahead of the slot; nil: none.
	warm func(target string)
	// waiters counts the runner's jobs waiting for a slot, and waitUnits their units (nil:
	// not counted); poke wakes its fetch loop.
	waiters   *atomic.Int64
	waitUnits *atomic.Int64
	poke      func()
	turn      turnGate
	horizon   atomic.Int64 // Unix ns of the latest slot the runner reserved
}

// admit waits for the job's leak slot; the pass ends, not sent, when ctx ends first or the
// schedule cannot be reached (ErrScheduleDown: handed back, for a worker that can reach it).
// A job whose unit budget took its slot already (job.charged, unitBudget) goes at once.
func (s *leakSlot) admit(ctx context.Context, cfg *QueueConfig, j *job) verdict {
	if j.charged {
		return pass()
	}
	if err := s.wait(ctx, cfg, j, s.take); err != nil {
		return refuse(endNotSent, err.Error())
	}
	return pass()
}

// observe marks a job whose delivery was paced by the queue's rate: its status write waits
// for the next apply tick.
func (s *leakSlot) observe(_ *QueueConfig, j *job, _ answer) { j.gather = s.paced() }

// take takes one slot, in turn (takeTurn), with the hooks of wait.
func (s *leakSlot) take(ctx context.Context, h leaky.Hooks) error {
	rate := s.rate()
	release, err := s.takeTurn(ctx, rate)
	if err != nil {
		return err
	}
	defer release()
	h.OnTake = func(at time.Time) {
		s.reserved(at)
		release()
	}
	return leaky.WaitHooks(ctx, s.takes, s.env.name, s.rate(), h)
}

// wait waits until the job may be delivered with take — leaky.Wait: take a slot, sleep until
// it, check the queue was not paused (nor the schedule's state lost) meanwhile — with a
// connection to the upstream dialed meanwhile. When the schedule cannot be reached it does not
// deliver: it counts the error and tries again after a backoff (takeBackoff), so delivery
// resumes within a fraction of a second of the store's return. The rate is read afresh on
// every try, so a reload applies at once. It returns ctx's error when ctx ends first, and
// ErrScheduleDown once the schedule has failed for storeGiveUp without a break (counted from
// the start of the first failed call: see failedSince), or as soon as another job of the Pool
// found it down.
func (s *leakSlot) wait(ctx context.Context, cfg *QueueConfig, j *job, take func(context.Context, leaky.Hooks) error) error {
	if s.warm != nil {
		target := cfg.Upstream
		if j.m.Job.Direct && cfg.Target != nil {
			target = cfg.Target.URL
		}
		s.warm(target)
	}
	units := max(j.m.Job.Cost, 1)
	if s.waitUnits != nil {
		s.waitUnits.Add(units)
	}
	s.waiters.Add(1)
	err := s.retryTake(ctx, take)
	if s.waitUnits != nil {
		s.waitUnits.Add(-units)
	}
	if s.waiters.Add(-1) == 0 || s.env.cfg().Fair {
		s.poke() // the fetch loop may be holding back for the slot waiters
	}
	return err
}

// retryTake is wait's loop.
func (s *leakSlot) retryTake(ctx context.Context, take func(context.Context, leaky.Hooks) error) error {
	start := s.env.now()
	var (
		b            *retry.Backoff // made at the first failure: most takes have none
		failingSince time.Time
	)
	m, name := s.env.m, s.env.name
	hooks := leaky.Hooks{
		Paused: s.paused,
		OnSlot: func(late time.Duration) { m.slotLate.WithLabelValues(name).Observe(late.Seconds()) },
		OnGiveUp: func(late time.Duration) {
			m.givenUp.WithLabelValues(name).Inc()
			s.env.log.Debug("worker: slot given up; woke too late to use it on time", "queue", name, "late", late)
		},
	}
	for {
		// An operator's pause holds every worker: no slot is taken while it lasts.
		if err := waitResumed(ctx, s.paused); err != nil {
			return err
		}
		tried := s.env.now()
		tctx, unbind := s.health.bind(ctx)
		err := take(tctx, hooks)
		down := err != nil && context.Cause(tctx) == ErrScheduleDown
		unbind()
		if err == nil {
			m.slotWait.WithLabelValues(name).Observe(s.env.now().Sub(start).Seconds())
			s.health.up(s.env.log)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if down {
			return ErrScheduleDown // another job found it down: this one goes back too
		}
		if errors.Is(err, leaky.ErrPaused) {
			continue
		}
		m.takeErrors.WithLabelValues(name).Inc()
		if errors.Is(err, leaky.ErrInvalidRate) {
			// Validated configs never get here; do not spin on one that did.
			s.env.log.Error("worker: invalid rate", "queue", name, "err", err)
		} else {
			s.env.log.Debug("worker: leak schedule unavailable", "queue", name, "err", err)
		}
		if failingSince.IsZero() {
			failingSince = failedSince(tried, s.env.now())
		}
		if (s.health.err() != nil || s.env.now().Sub(failingSince) >= storeGiveUp) && !errors.Is(err, leaky.ErrInvalidRate) {
			s.health.down(s.env.log, failingSince, err)
			return ErrScheduleDown
		}
		if b == nil {
			b = takeBackoff.Backoff(nil)
		}
		if err := b.Wait(ctx, 0); err != nil {
			return err
		}
	}
}

// storeGiveUp is how long a job waits for an unreachable leak schedule (or place store) before
// it is handed back, counted from the start of the first call that failed. Every Redis call
// ends within connect.CallTimeout, half of it, so a black-holed Redis is given up after two
// failed calls, about storeGiveUp after the first began: a worker cut off from Redis hands its
// jobs back within storeGiveUp (and a backoff's 10ms) of the cut, plus the wait of a job that
// was asleep until its slot then (reserveAhead), not after seconds of dial retries.
const storeGiveUp = 2 * time.Second

// failedSince is when the failing that a call tried at tried and failed at failed shows began:
// when the call that failed was sent. A try may have slept first (until its slot, for a place)
// but the call that failed began at most storeTimeout (connect.CallTimeout, the bound of every
// Redis call) before it failed.
func failedSince(tried, failed time.Time) time.Time {
	if at := failed.Add(-storeTimeout); at.After(tried) {
		return at
	}
	return tried
}

// ErrScheduleDown is what Pool.Ready returns (wrapped) while the leak schedule cannot be reached:
// the Pool then hands back its jobs and fetches none until the schedule answers again.
var ErrScheduleDown = errors.New("worker: leak schedule unreachable")

// scheduleHealth is whether the Pool's leak schedule (and place store: the same Redis)
// answers. It is safe for concurrent use; the zero value answers.
type scheduleHealth struct {
	fault atomic.Pointer[scheduleFault] // nil: it answers
	// gone is cancelled, with cause ErrScheduleDown, when the schedule is found down, and
	// replaced when it answers again (nil until needed); see bind.
	mu     sync.Mutex
	gone   context.Context
	cancel context.CancelCauseFunc
}

// bind returns ctx, cancelled too, with cause ErrScheduleDown, once a job of the Pool finds
// the schedule down (down): the other jobs' waits for a slot or a place then end at once and
// they go back with it, instead of each waiting out its own failed calls. A ctx bound while the
// schedule is already down is not cut: its own call decides. unbind releases it.
func (h *scheduleHealth) bind(ctx context.Context) (_ context.Context, unbind func()) {
	h.mu.Lock()
	if h.gone == nil {
		h.gone, h.cancel = context.WithCancelCause(context.Background())
	}
	gone := h.gone
	h.mu.Unlock()
	if gone.Err() != nil {
		return ctx, func() {}
	}
	bctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(gone, func() { cancel(ErrScheduleDown) })
	return bctx, func() { stop(); cancel(context.Canceled) }
}

type scheduleFault struct {
	since time.Time
	err   error
}

// down records that the schedule has failed since since, with err; it logs the first time.
func (h *scheduleHealth) down(log *slog.Logger, since time.Time, err error) {
	if h.fault.CompareAndSwap(nil, &scheduleFault{since: since, err: err}) {
		h.mu.Lock()
		if h.cancel != nil {
			h.cancel(ErrScheduleDown)
		}
		h.mu.Unlock()
		log.Warn("worker: leak schedule unreachable; handing jobs back and fetching none until it answers",
			"since", since, "err", err)
	}
}

// up records that the schedule answered; it logs when it had not.
func (h *scheduleHealth) up(log *slog.Logger) {
	if f := h.fault.Swap(nil); f != nil {
		h.mu.Lock()
		if h.gone != nil && h.gone.Err() != nil {
			h.gone, h.cancel = context.WithCancelCause(context.Background())
		}
		h.mu.Unlock()
		log.Info("worker: leak schedule answers again; fetching", "down_for", time.Since(f.since).Round(time.Millisecond))
	}
}

// err is nil while the schedule answers, and otherwise ErrScheduleDown, with since when and why.
func (h *scheduleHealth) err() error {
	f := h.fault.Load()
	if f == nil {
		return nil
	}
	return fmt.Errorf("%w since %s: %v", ErrScheduleDown, f.since.UTC().Format(time.RFC3339), f.err)
}

// takeBackoff spaces the retries of a failed slot take: short, so that delivery resumes within a
// fraction of a second of the store's return.
var takeBackoff = retry.Policy{Initial: 10 * time.Millisecond, Max: 200 * time.Millisecond}

// baseRate is the queue's leak rate: the config's, or the one an operator set at run time.
func baseRate(env queueEnv) leaky.Rate {
	rate := env.cfg().Rate
	if s := env.control().Rate; s != "" {
		if rt, err := config.ParseRate(s); err == nil && rt.Interval() > 0 {
			rate.Interval = rt.Interval()
		}
	}
	return rate
}

// rate is the leak rate slots are taken at: baseRate, or for an adaptive queue the rate the
// workers learned, when that is lower.
func (s *leakSlot) rate() leaky.Rate {
	rate := baseRate(s.env)
	if eff := s.learned(); eff > 0 {
		if iv := time.Duration(float64(time.Second) / eff); iv > rate.Interval {
			rate.Interval = iv
		}
	}
	return rate
}

// lowest returns the lowest of the rates, in deliveries per second, that are above 0; 0 when
// none is: the leak slot's lower rates (the learned rate, a region's share).
func lowest(rates ...func() float64) func() float64 {
	return func() float64 {
		low := 0.0
		for _, r := range rates {
			if v := r(); v > 0 && (low == 0 || v < low) {
				low = v
			}
		}
		return low
	}
}

// reserveAhead bounds how far ahead of now a runner reserves leak slots while its queue is
// throttled: a job in hand takes its slot only once the runner's latest reservation is at most
// reserveAhead away. A worker that stalls (a GC pause, a starved CPU, SIGSTOP) gives up the
// slots it cannot use on time when it resumes; holding no more than reserveAhead of them, it
// costs the queue at most that much of its rate, not the slots of every job it holds (a
// second's worth at 50/s with 16 jobs in hand). It is well above a Redis round trip and the
// wake-up before a slot (checkLead), so a worker always has its next slot reserved in time.
const reserveAhead = 100 * time.Millisecond

// paced reports whether the runner's deliveries are paced by its queue's rate, several per
// apply tick: its slots are reserved more than a tick ahead (it holds a backlog the rate
// holds back), at two or more slots per tick (a rate of 200/s or more). Their status writes
// then wait for the tick (apply.go, applyTick); an unthrottled drain's, whose slots are never
// a tick ahead, and a slow queue's, which has little to gather, go at once.
func (s *leakSlot) paced() bool {
	iv := s.rate().Interval
	return iv > 0 && 2*iv <= applyTick && s.horizon.Load() > s.env.now().Add(applyTick).UnixNano()
}

// maxTurns is the most jobs of a runner that take their slots together while slots are
// reserved ahead; see turns.
const maxTurns = 8

// turns is how many jobs of the runner may take their slots at once while slots are reserved
// ahead at rate: as many as fit in a tenth of reserveAhead at the queue's interval, at least 1
// and at most maxTurns. They wake together when the latest reservation comes within
// reserveAhead, and their takes share a round trip (leaky.Coalesce), so a runner at thousands
// of slots a second takes them several per call; the ones beyond the first reach at most a
// tenth of reserveAhead past it, so a stalled worker holds barely more. At tens of slots a
// second it is 1: one job at a time, as the stall bound wants.
func turns(rate leaky.Rate) int {
	if rate.Interval <= 0 {
		return maxTurns
	}
	return max(1, min(maxTurns, int(reserveAhead/10/rate.Interval)))
}

// takeTurn waits until a job of the runner may reserve its slot: at once while nothing is
// reserved ahead (an unthrottled queue, or one behind), else among the turns(rate) jobs at a
// time whose takes go together, once the latest reservation is within reserveAhead. release
// ends the turn; it is idempotent.
func (s *leakSlot) takeTurn(ctx context.Context, rate leaky.Rate) (release func(), err error) {
	if s.horizon.Load() <= s.env.now().UnixNano() {
		return func() {}, nil
	}
	if err := s.turn.acquire(ctx, turns(rate)); err != nil {
		return nil, err
	}
	var once sync.Once
	release = func() { once.Do(func() { s.turn.release(turns(rate)) }) }
	for {
		now := s.env.now()
		wait := time.Duration(s.horizon.Load()-now.UnixNano()) - reserveAhead
		if wait <= 0 {
			return release, nil
		}
		// The turns whose time falls in one turnGrid wake together, so that their takes share
		// a call: each turn's own instant set a timer, a wake-up and a round trip per slot.
		wait = onTurnGrid(now.Add(wait)).Sub(now)
		if err := retry.Sleep(ctx, nil, wait); err != nil {
			release()
			return nil, err
		}
	}
}

// turnGrid is the spacing of the instants on which turns waiting for the reservations to come
// within reserveAhead wake: a tenth of reserveAhead, so a runner reserves at most that much more
// ahead, and at thousands of slots a second the turns of a grid (up to maxTurns) take their
// slots in one call, consecutive slots that its jobs let go together (leaky.Grid).
const turnGrid = reserveAhead / 10

// onTurnGrid returns the first multiple of turnGrid of the Unix clock at or after t.
func onTurnGrid(t time.Time) time.Time {
	off := time.Duration(t.UnixNano() % int64(turnGrid))
	if off <= 0 {
		return t.Add(-off)
	}
	return t.Add(turnGrid - off)
}

// turnGate lets up to a limit of holders in at once, the others in the order they came. A
// release hands the turn to one waiter, not to all of them: a runner may hold dozens of jobs
// waiting for a turn, and hundreds of turns a second pass.
type turnGate struct {
	mu      sync.Mutex
	out     int
	waiters []chan struct{} // closed when handed the turn
}

// acquire waits for a turn while fewer than limit are held, until ctx ends.
func (g *turnGate) acquire(ctx context.Context, limit int) error {
	g.mu.Lock()
	if g.out < limit && len(g.waiters) == 0 {
		g.out++
		g.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	g.waiters = append(g.waiters, ch)
	g.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		g.mu.Lock()
		for i, w := range g.waiters {
			if w == ch {
				g.waiters = append(g.waiters[:i], g.waiters[i+1:]...)
				g.mu.Unlock()
				return ctx.Err()
			}
		}
		g.mu.Unlock()
		g.release(limit) // handed the turn as ctx ended: pass it on
		return ctx.Err()
	}
}

// release gives a turn back, and hands turns to waiters while fewer than limit are held.
func (g *turnGate) release(limit int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.out--
	for g.out < max(limit, 1) && len(g.waiters) > 0 {
		close(g.waiters[0])
		g.waiters = g.waiters[1:]
		g.out++
	}
}

// reserved records a slot the runner reserved at at.
func (s *leakSlot) reserved(at time.Time) {
	n := at.UnixNano()
	for {
		old := s.horizon.Load()
		if n <= old || s.horizon.CompareAndSwap(old, n) {
			return
		}
	}
}
