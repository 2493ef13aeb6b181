package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/retry"
)

// waitSlot waits until the job may be delivered, with leaky.Wait: it takes a leak slot, sleeps
// until it, and checks that the queue was not paused (nor the schedule's state lost) meanwhile.
// When the schedule cannot be reached it does not deliver: it counts the error and tries again
// after a backoff (takeBackoff), so delivery resumes within a fraction of a second
// of the store's return. The rate is read afresh on every try, so a reload applies at once.
// It returns ctx's error when ctx ends first, and ErrScheduleDown once the schedule has failed
// for storeGiveUp without a break: the job is then handed back, for a worker that can reach it.
func (r *runner) waitSlot(ctx context.Context, cfg *QueueConfig, j *job) error {
	start := r.p.now()
	failures := 0
	var failingSince time.Time
	held := func() bool { return r.p.control(r.name).PausedAt(r.p.now()) }
	for {
		// An operator's pause holds every worker: no slot is taken while it lasts.
		for held() {
			if retry.Sleep(ctx, nil, heldPoll) != nil {
				return ctx.Err()
			}
		}
		err := r.waitOnce(ctx, cfg, j, leaky.Hooks{
			Held:   held,
			OnSlot: func(late time.Duration) { r.p.m.slotLate.WithLabelValues(r.name).Observe(late.Seconds()) },
			OnGiveUp: func(late time.Duration) {
				r.p.m.givenUp.WithLabelValues(r.name).Inc()
				r.p.log.Debug("worker: slot given up; woke too late to use it on time", "queue", r.name, "late", late)
			},
		})
		if err == nil {
			r.p.m.slotWait.WithLabelValues(r.name).Observe(r.p.now().Sub(start).Seconds())
			r.p.health.up(r.p.log)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, leaky.ErrHeld) {
			continue
		}
		r.p.m.takeErrors.WithLabelValues(r.name).Inc()
		if errors.Is(err, leaky.ErrInvalidRate) {
			// Validated configs never get here; do not spin on one that did.
			r.p.log.Error("worker: invalid rate", "queue", r.name, "err", err)
		} else {
			r.p.log.Debug("worker: leak schedule unavailable", "queue", r.name, "err", err)
		}
		if failures == 0 {
			failingSince = r.p.now()
		}
		if (r.p.health.err() != nil || r.p.now().Sub(failingSince) >= storeGiveUp) && !errors.Is(err, leaky.ErrInvalidRate) {
			r.p.health.down(r.p.log, failingSince, err)
			return ErrScheduleDown
		}
		failures++
		if err := retry.Sleep(ctx, nil, takeBackoff.Delay(failures, rand.Float64())); err != nil {
			return err
		}
	}
}

// waitOnce waits for j's slot once (leaky.WaitHooks), or for a queue with a unit budget for
// its slot and units (leaky.WaitCost), one job of the queue at a time in this process
// (unitTurn; cost.go), and records the charge on j.
func (r *runner) waitOnce(ctx context.Context, cfg *QueueConfig, j *job, h leaky.Hooks) error {
	cs, ok := r.costSchedule(cfg)
	if !ok || j == nil {
		rate := r.rate()
		release, err := r.takeTurn(ctx, rate)
		if err != nil {
			return err
		}
		defer release()
		h.OnTake = func(at time.Time) {
			r.reserved(at)
			release()
		}
		return leaky.WaitHooks(ctx, r.p.takes, r.name, r.rate(), h)
	}
	select {
	case r.unitTurn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-r.unitTurn }()
	c, err := leaky.WaitCost(ctx, cs, r.name, r.rate(), r.unitAsk(cfg, j), h)
	if err == nil {
		j.charge, j.charged = c, true
	}
	return err
}

// storeGiveUp is how long a job waits for an unreachable leak schedule before it is handed back.
const storeGiveUp = 2 * time.Second

// ErrScheduleDown is what Pool.Ready returns (wrapped) while the leak schedule cannot be reached:
// the Pool then hands back its jobs and fetches none until the schedule answers again.
var ErrScheduleDown = errors.New("worker: leak schedule unreachable")

// scheduleHealth is whether the Pool's leak schedule answers. It is safe for concurrent use.
type scheduleHealth struct {
	fault atomic.Pointer[scheduleFault] // nil: it answers
}

type scheduleFault struct {
	since time.Time
	err   error
}

// down records that the schedule has failed since since, with err; it logs the first time.
func (h *scheduleHealth) down(log *slog.Logger, since time.Time, err error) {
	if h.fault.CompareAndSwap(nil, &scheduleFault{since: since, err: err}) {
		log.Warn("worker: leak schedule unreachable; handing jobs back and fetching none until it answers",
			"since", since, "err", err)
	}
}

// up records that the schedule answered; it logs when it had not.
func (h *scheduleHealth) up(log *slog.Logger) {
	if f := h.fault.Swap(nil); f != nil {
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

// probe asks the schedule whether it answers again (a read, PausedFor), and records the answer.
func (r *runner) probe(ctx context.Context) bool {
	pctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	if _, err := r.p.sched.PausedFor(pctx, r.name); err != nil {
		return false
	}
	r.p.health.up(r.p.log)
	return true
}

// takeBackoff spaces the retries of a failed slot take: short, so that delivery resumes within a
// fraction of a second of the store's return.
var takeBackoff = retry.Policy{Initial: 10 * time.Millisecond, Max: 200 * time.Millisecond}

// heldPoll is how often a worker looks whether an operator's pause of its queue has ended (the
// controls themselves arrive by a watch, at once).
const heldPoll = 100 * time.Millisecond

// baseRate is the queue's leak rate: the config's, or the one an operator set at run time.
func (r *runner) baseRate() leaky.Rate {
	rate := r.cfg.Load().Rate
	if s := r.p.control(r.name).Rate; s != "" {
		if rt, err := config.ParseRate(s); err == nil && rt.Interval() > 0 {
			rate.Interval = rt.Interval()
		}
	}
	return rate
}

// rate is the leak rate slots are taken at: baseRate, or for an adaptive queue the rate the
// workers learned, when that is lower.
func (r *runner) rate() leaky.Rate {
	rate := r.baseRate()
	if eff := r.learn.rate(); eff > 0 {
		if iv := time.Duration(float64(time.Second) / eff); iv > rate.Interval {
			rate.Interval = iv
		}
	}
	return rate
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
// settle tick: its slots are reserved more than a tick ahead (it holds a backlog the rate
// holds back), at two or more slots per tick (a rate of 200/s or more). Their status writes
// then wait for the tick (apply.go, settleTick); an unthrottled drain's, whose slots are never
// a tick ahead, and a slow queue's, which has little to gather, go at once.
func (r *runner) paced() bool {
	iv := r.rate().Interval
	return iv > 0 && 2*iv <= settleTick && r.horizon.Load() > r.p.now().Add(settleTick).UnixNano()
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
func (r *runner) takeTurn(ctx context.Context, rate leaky.Rate) (release func(), err error) {
	if r.horizon.Load() <= r.p.now().UnixNano() {
		return func() {}, nil
	}
	if err := r.slotTurn.acquire(ctx, turns(rate)); err != nil {
		return nil, err
	}
	var once sync.Once
	release = func() { once.Do(func() { r.slotTurn.release(turns(rate)) }) }
	for {
		wait := time.Duration(r.horizon.Load()-r.p.now().UnixNano()) - reserveAhead
		if wait <= 0 {
			return release, nil
		}
		if err := retry.Sleep(ctx, nil, wait); err != nil {
			release()
			return nil, err
		}
	}
}

// turnGate lets up to a limit of holders in at once, the others in the order they came. A
// release hands the turn to one waiter, not to all of them: a runner may hold dozens of jobs
// waiting for a turn, and hundreds of turns a second pass.
type turnGate struct {
	mu      sync.Mutex
	held    int
	waiters []chan struct{} // closed when handed the turn
}

// acquire waits for a turn while fewer than limit are held, until ctx ends.
func (g *turnGate) acquire(ctx context.Context, limit int) error {
	g.mu.Lock()
	if g.held < limit && len(g.waiters) == 0 {
		g.held++
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
	g.held--
	for g.held < max(limit, 1) && len(g.waiters) > 0 {
		close(g.waiters[0])
		g.waiters = g.waiters[1:]
		g.held++
	}
}

// reserved records a slot the runner reserved at at.
func (r *runner) reserved(at time.Time) {
	n := at.UnixNano()
	for {
		old := r.horizon.Load()
		if n <= old || r.horizon.CompareAndSwap(old, n) {
			return
		}
	}
}
