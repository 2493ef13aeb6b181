package leaky

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Rate is a queue's leak rate: one slot every Interval, with up to Burst extra slots available at
// once after idleness (0 = strictly spaced). Interval must be > 0; it is rounded up to a whole
// microsecond, so a rate is never exceeded by rounding. Burst must be ≥ 0.
type Rate struct {
	Interval time.Duration
	Burst    int64
}

// Every returns the Rate of n slots per period, with no burst: Every(50, time.Second) is 50/s.
func Every(n int64, period time.Duration) Rate {
	if n <= 0 {
		return Rate{}
	}
	return Rate{Interval: period / time.Duration(n)}
}

// String formats the rate as "<interval>" or "<interval>+<burst>".
func (r Rate) String() string {
	if r.Burst == 0 {
		return r.Interval.String()
	}
	return fmt.Sprintf("%v+%d", r.Interval, r.Burst)
}

// maxTolerance bounds Burst × Interval (about 35 years), so no arithmetic overflows.
const maxTolerance = int64(1) << 50

// micros returns the rate's interval and burst tolerance in µs, or ErrInvalidRate.
func (r Rate) micros() (interval, tolerance int64, err error) {
	if r.Interval <= 0 || r.Burst < 0 {
		return 0, 0, fmt.Errorf("%w: %v (interval must be > 0, burst ≥ 0)", ErrInvalidRate, r)
	}
	interval = ceilMicros(r.Interval)
	if r.Burst > 0 && interval > maxTolerance/r.Burst {
		return 0, 0, fmt.Errorf("%w: %v (burst × interval too large)", ErrInvalidRate, r)
	}
	return interval, r.Burst * interval, nil
}

func ceilMicros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// Tolerance is how late a delivery may leave after its slot: half an interval up to StrictRate,
// so that deliveries within [slot, slot+Tolerance] put at most rate + Burst + 1 into any
// one-second window, and MinTolerance above it, which allows at most 1% more
// (⌈Tolerance × rate⌉ − 1): at 500/s an interval is 2ms, less than a loaded machine's timers
// and scheduler keep to, and a tighter tolerance gave up 4–8% of the slots.
func (r Rate) Tolerance() time.Duration {
	if r.Interval*StrictRate >= time.Second {
		return r.Interval / 2
	}
	return MinTolerance
}

// MinTolerance is the lateness Wait tolerates before it gives up a slot above StrictRate.
const MinTolerance = 10 * time.Millisecond

// Grid is the spacing of the instants on which Wait ends its sleeps above StrictRate, for a
// slot reserved more than a millisecond ahead (checkMin): it is let go at the first multiple of
// Grid of the Unix clock at or after it (at most Grid late, well within MinTolerance). The
// slots a process holds then wake together, a few per wake-up at thousands a second, rather
// than one wake-up of the process each: every wake from idle costs a thread's wake, the
// scheduler's spinning and the runtime's monitor's shorter sleeps (docs/design/worker-costs.md).
// At StrictRate and below a slot is let go at its instant, as its tolerance is tighter.
const Grid = MinTolerance / 4

// grid is the spacing of the instants a wait at r ends its sleeps on: Grid above StrictRate,
// 0 (none) at or below it.
func (r Rate) grid() time.Duration {
	if r.Interval > 0 && r.Interval*StrictRate < time.Second {
		return Grid
	}
	return 0
}

// StrictRate is the highest rate, per second, at which Tolerance keeps every one-second window
// to rate + Burst + 1 deliveries.
const StrictRate = 200

// ErrInvalidRate is returned (wrapped) by Take and Wait for a Rate with Interval ≤ 0 or Burst < 0.
var ErrInvalidRate = errors.New("leaky: invalid rate")

// Slot is a reserved delivery slot.
type Slot struct {
	// Wait is how long to sleep before delivering; 0 = go now.
	Wait time.Duration
	// At is the slot's instant on the local clock, never before the slot. For Memory it is
	// exact. For Redis the slot is an instant of the server's clock, placed on the local one
	// within the shortest round trip the process has seen (see Redis): At is the latest it
	// can be.
	At time.Time

	// early is the earliest the slot can be on the local clock (Redis; zero: At), which Wait
	// wakes checkLead before to check the queue and place the slot again.
	early time.Time
	// strict: the clock that placed the slot is young (Redis), and lateness counts from early.
	strict bool
	// sched is the slot's instant on the schedule's own clock, µs (Redis: the server's TIME).
	sched int64
	// epoch identifies the schedule state the slot was reserved in (Redis only; 0 = none).
	epoch int64
	// retry: nothing was reserved (TakeCost beyond Ask.Ahead); ask again after Wait.
	retry bool
	// wide: the wait for the slot is on a grid (above StrictRate), whose tolerance lets a
	// young clock's check be answered from the latest reading (Redis.check).
	wide bool
}

// late is how late it is for s at now: since At, the latest the slot can be, or for a strict
// slot since early, the earliest. A slot is the instant the schedule ran the take (plus its
// wait), which a slow reply leaves anywhere between the two while nothing bounds the clocks
// more tightly.
func (s Slot) late(now time.Time) time.Duration {
	if s.strict && !s.early.IsZero() {
		return now.Sub(s.early)
	}
	return now.Sub(s.At)
}

// Schedule is a queue-wide leak schedule. Implementations are safe for concurrent use. Errors
// mean the schedule could not be consulted (e.g. Redis is unreachable); they are never "over the
// rate", which is a Slot with a Wait.
type Schedule interface {
	// Take reserves the queue's next slot at rate r. The caller sleeps Slot.Wait and then
	// delivers (after checking PausedFor, as Wait does). It returns an error wrapping
	// ErrInvalidRate for an invalid r.
	Take(ctx context.Context, queue string, r Rate) (Slot, error)
	// Pause moves the queue's schedule so no slot starts before now+d, for every worker;
	// pausing less than an existing pause does nothing, as does d ≤ 0. d is rounded up to a
	// whole microsecond.
	Pause(ctx context.Context, queue string, d time.Duration) error
	// PausedFor reports how long the queue stays paused from now (0 = not paused). Workers call
	// it after waking for a slot reserved before a pause, and wait that long (then Take again)
	// rather than deliver into a pause.
	PausedFor(ctx context.Context, queue string) (time.Duration, error)
}

// checker is implemented by schedules whose state can be lost while reservations are
// outstanding (Redis): it reports PausedFor and whether a slot's reservation still stands.
type checker interface {
	// placed is s placed again with what the check's round trip taught about the clocks.
	check(ctx context.Context, queue string, s Slot) (paused time.Duration, valid bool, placed Slot, err error)
}

// checkLead is how long before its slot Wait asks the schedule whether the queue was paused or
// its state lost: more than a round trip to Redis takes on a loaded machine, so that the answer
// is in by the slot (at 2ms, round trips overran it and made slots late).
const checkLead = 10 * time.Millisecond

// checkMin is the shortest wait for a slot that Wait checks before the slot: a check's round
// trip takes longer than this, so a slot sooner after its take is used without one, as a
// slot free at once is (Take saw no pause, atomically with the reservation).
const checkMin = time.Millisecond

// Progress reporting in Wait: before every sleep of at least ProgressThreshold, and then every
// ProgressInterval while it lasts, Wait calls its onWait with the time left, so a worker can tell
// JetStream the message is in progress (an AckWait longer than ProgressInterval is then safe).
const (
	ProgressThreshold = time.Second
	ProgressInterval  = 5 * time.Second
)

// Wait reserves a slot of queue at rate r and returns when the caller may deliver: it takes a
// slot and sleeps until it. Shortly before the slot (checkLead; above StrictRate, at the slot,
// on the Grid) it asks whether the queue was paused meanwhile (PausedFor); if it was, it sleeps the pause out and takes a new slot. On a
// Redis schedule it also takes a new slot if the state the reservation was made in has been
// lost. A slot it wakes for later than r.Tolerance() is given up, and it takes a new one.
// onWait, if not nil, is called before each sleep of at least ProgressThreshold and every
// ProgressInterval during it, with the time left to sleep.
//
// Wait returns nil when the caller may deliver, ctx.Err() as soon as ctx ends (the reserved slot
// is then not used), or the schedule's error.
func Wait(ctx context.Context, s Schedule, queue string, r Rate, onWait func(time.Duration)) error {
	return WaitHooks(ctx, s, queue, r, Hooks{OnWait: onWait})
}

// Hooks let a caller of WaitHooks observe a wait. Nil fields are not called.
type Hooks struct {
	// OnWait is Wait's onWait.
	OnWait func(left time.Duration)
	// OnGiveUp is called for each slot given up for being late, with how late it was.
	OnGiveUp func(late time.Duration)
	// OnTake, if set, is called after each slot is reserved, with the slot's instant.
	OnTake func(at time.Time)
	// Paused, if set, is asked right before WaitHooks would return: true gives the slot up and
	// makes WaitHooks return ErrPaused (an operator paused the queue while the slot was reserved).
	Paused func() bool
	// OnSlot, if set, is called with how late after its slot the caller is let go (0 for a
	// slot that was free at once), right before WaitHooks returns nil.
	OnSlot func(late time.Duration)
	// Clock, if set, is the clock WaitHooks reads and sleeps on, in place of the real one: a
	// test gives the same fake clock to the schedule (NewMemory's now, RedisConfig.Now) and
	// here, and a wait then takes no real time. Nil: time.Now and a time.Timer reused across
	// the sleeps of one call.
	Clock Clock
}

// Clock is a source of time that WaitHooks can be driven by: Now, and a channel that receives
// once d has passed. It has the method set of retry.Clock, so retrytest's fake clocks are
// Clocks. Implementations must be safe for concurrent use.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

// ErrPaused is returned by WaitHooks when Hooks.Paused said the queue is paused.
var ErrPaused = errors.New("leaky: queue paused")

// WaitHooks is Wait with hooks that observe it.
func WaitHooks(ctx context.Context, s Schedule, queue string, r Rate, h Hooks) error {
	w := waiter{s: s, queue: queue, rate: r, h: h, sleeper: sleeper{clock: h.Clock}, grid: r.grid()}
	w.ck, _ = s.(checker)
	defer w.stop()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		slot, err := s.Take(ctx, queue, r)
		if err != nil {
			return err
		}
		if h.OnTake != nil {
			h.OnTake(slot.At)
		}
		if ok, err := w.await(ctx, slot); ok || err != nil {
			return err
		}
	}
}

// waiter is the state of one WaitHooks call.
type waiter struct {
	s     Schedule
	ck    checker // s's, if it has one
	queue string
	rate  Rate
	h     Hooks
	// grid is the spacing of the instants the waiter's sleeps end on (Rate.grid; 0: none).
	grid time.Duration
	sleeper
}

// await waits for slot: it reports true when the caller may deliver, false when the slot is
// spent (given up for being late, or voided by a pause or lost state) and a new one must be
// taken, or an error (ctx's, the schedule's, ErrPaused).
func (w *waiter) await(ctx context.Context, slot Slot) (bool, error) {
	if slot.Wait <= 0 {
		// Take saw no pause, atomically with the reservation; the reply may still have come
		// back later than the slot may be late.
		return w.release(slot, true)
	}
	if slot.Wait <= checkMin {
		// No check could answer before such a slot (one of a batch at a high rate, say): it
		// is used as a slot free at once is, after a sleep to its instant. Not on the grid:
		// a slot this close was not reserved ahead (an unthrottled queue's, or a runner's
		// behind its rate), and the grid would hold its job up to thousands of intervals.
		if err := w.sleep(ctx, slot.At.Sub(w.now()), nil, ProgressThreshold, ProgressInterval); err != nil {
			return false, err
		}
		return w.release(slot, false)
	}
	slot, retake, err := w.sleepToSlot(ctx, slot)
	if retake || err != nil {
		return false, err
	}
	return w.release(slot, false)
}

// sleepToSlot sleeps until slot, waking checkLead before it to ask about pauses and lost state,
// so that the round trip is over by the slot. Both sleeps end at local instants of the slot,
// not after Slot.Wait: that counts from when the schedule ran the take, which may be well
// before its reply came back. It returns the slot as the check placed it again, or retake
// (after sleeping out a pause) when the slot may not be used.
//
// On a grid (above StrictRate) it checks at the slot instead, with one wake-up: the answer
// then nearly always comes from the latest take's reading (Redis.check), at thousands of slots
// a second taken every few milliseconds, and a round trip when it does not is within the
// slot's tolerance of MinTolerance.
func (w *waiter) sleepToSlot(ctx context.Context, slot Slot) (_ Slot, retake bool, err error) {
	wake := slot.early
	if wake.IsZero() {
		wake = slot.At
	}
	if w.grid == 0 {
		wake = wake.Add(-checkLead)
	}
	if err := w.sleep(ctx, w.until(wake), w.h.OnWait, ProgressThreshold, ProgressInterval); err != nil {
		return slot, false, err
	}
	paused, valid, slot, err := w.check(ctx, slot)
	switch {
	case err != nil:
		return slot, false, err
	case paused > 0:
		return slot, true, w.sleep(ctx, paused, w.h.OnWait, ProgressThreshold, ProgressInterval)
	case !valid:
		return slot, true, nil
	}
	return slot, false, w.sleep(ctx, w.until(slot.At), nil, ProgressThreshold, ProgressInterval)
}

// until returns how long to sleep until t, moved up to the waiter's next grid instant: a slot
// is never let go early, and a check never reads the queue earlier than checkLead before its
// slot (it may read it up to a grid later).
func (w *waiter) until(t time.Time) time.Duration {
	if w.grid > 0 {
		t = onGrid(t, w.grid)
	}
	return t.Sub(w.now())
}

// onGrid returns the first multiple of g of the Unix clock at or after t.
func onGrid(t time.Time, g time.Duration) time.Time {
	off := time.Duration(t.UnixNano() % int64(g))
	if off < 0 {
		off += g
	}
	if off == 0 {
		return t
	}
	return t.Add(g - off)
}

// check asks the schedule whether the queue was paused since slot was taken and whether the
// reservation still stands, and places slot again where the schedule can (Redis).
func (w *waiter) check(ctx context.Context, slot Slot) (paused time.Duration, valid bool, _ Slot, err error) {
	slot.wide = w.grid > 0
	if w.ck != nil {
		return w.ck.check(ctx, w.queue, slot)
	}
	paused, err = w.s.PausedFor(ctx, w.queue)
	return paused, true, slot, err
}

// release decides, as close to the delivery as it can be, whether the caller may use slot: a
// slot that can no longer be used on time is given up (false), never spent late; a held queue
// gives it up with ErrPaused; otherwise OnSlot hears how late the caller goes (0 for a slot that
// was free at once) and release reports true.
func (w *waiter) release(slot Slot, free bool) (bool, error) {
	now := w.now()
	if late := slot.late(now); late > w.rate.Tolerance() {
		if w.h.OnGiveUp != nil {
			w.h.OnGiveUp(late)
		}
		return false, nil
	}
	if w.h.Paused != nil && w.h.Paused() {
		return false, ErrPaused
	}
	if w.h.OnSlot != nil {
		var late time.Duration
		if !free {
			late = max(w.now().Sub(slot.At), 0)
		}
		w.h.OnSlot(late)
	}
	return true, nil
}

// sleeper sleeps on a Clock, or on the real clock with one timer reused across its sleeps (a
// Wait sleeps up to three times per slot, so the timer is allocated once).
type sleeper struct {
	clock Clock       // nil: the real clock
	timer *time.Timer // the real clock's, once one sleep needed it
}

func (s *sleeper) now() time.Time {
	if s.clock != nil {
		return s.clock.Now()
	}
	return time.Now()
}

// after returns a channel that receives once d has passed.
func (s *sleeper) after(d time.Duration) <-chan time.Time {
	if s.clock != nil {
		return s.clock.After(d)
	}
	if s.timer == nil {
		s.timer = time.NewTimer(d)
	} else {
		s.timer.Reset(d)
	}
	return s.timer.C
}

// stop releases the real clock's timer.
func (s *sleeper) stop() {
	if s.timer != nil {
		s.timer.Stop()
	}
}

// sleep sleeps d unless ctx ends first. If d ≥ threshold it calls onWait (if not nil) first and
// then every period while at least threshold is left, with the time left.
func (s *sleeper) sleep(ctx context.Context, d time.Duration, onWait func(time.Duration), threshold, period time.Duration) error {
	deadline := s.now().Add(d)
	for {
		left := deadline.Sub(s.now())
		if left <= 0 {
			return nil
		}
		step := left
		if onWait != nil && left >= threshold {
			onWait(left)
			step = min(left, period)
		}
		select {
		case <-ctx.Done():
			s.stop()
			return ctx.Err()
		case <-s.after(step):
		}
	}
}
