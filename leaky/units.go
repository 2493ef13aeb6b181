package leaky

import (
	"context"
	_ "embed"
	"fmt"
	"math/bits"
	"time"

	"github.com/redis/go-redis/v9"
)

// Units is a queue's unit budget beside its Rate: N units (tokens, bytes, …) per Per, with up to
// Burst units available at once after idleness (0: a job's units are spaced at the budget's
// rate from the previous job's). The zero value is no unit budget.
type Units struct {
	N     int64
	Per   time.Duration
	Burst int64
}

// IsZero reports whether u is no unit budget.
func (u Units) IsZero() bool { return u.N == 0 && u.Per == 0 }

// String formats u as "N/Per" or "N/Per+Burst".
func (u Units) String() string {
	if u.Burst == 0 {
		return fmt.Sprintf("%d/%v", u.N, u.Per)
	}
	return fmt.Sprintf("%d/%v+%d", u.N, u.Per, u.Burst)
}

// span is c units of u in µs, c × Per / N, rounded up (up: a charge is never cheaper than the
// budget's rate) or down (down: a burst tolerance never larger), exactly, or false when it does
// not fit in maxTolerance.
func (u Units) span(c int64, up bool) (int64, bool) {
	per := uint64(u.Per / time.Microsecond)
	hi, lo := bits.Mul64(uint64(c), per)
	if hi >= uint64(u.N) {
		return 0, false
	}
	q, r := bits.Div64(hi, lo, uint64(u.N))
	if up && r != 0 {
		q++
	}
	if q > uint64(maxTolerance) {
		return 0, false
	}
	return int64(q), true
}

// Ask is one job's demand on its queue's unit budget, for TakeCost and WaitCost.
type Ask struct {
	// Units is the queue's unit budget; it must not be zero.
	Units Units
	// Cost is what the job is charged, ≥ 1: its estimate, reconciled later with Reconcile.
	// The caller caps it at what the budget can deliver (N, or Burst if larger): a larger
	// cost is charged in full, spacing the next job's units that much later.
	Cost int64
	// Ahead, when > 0, is the furthest ahead of now a take reserves the job's units: a job
	// whose units come later is told when to ask again (at Ahead before them) and reserves
	// nothing, so that refunds of the jobs before it, reconciled meanwhile, still bring its
	// units forward. 0: reserve however far ahead.
	Ahead time.Duration
	// Poll, when > 0, bounds how long WaitCost waits before asking again for units beyond
	// Ahead: a refund moves them earlier than the wait it was told.
	Poll time.Duration
	// Budget names the queue's budget the units are of (TakeCosts); "" for TakeCost, the
	// queue's one unit budget.
	Budget string
}

// micros returns the ask's increment and burst tolerance in µs, or ErrInvalidRate.
func (a Ask) micros() (inc, tolerance int64, err error) {
	u := a.Units
	if u.N <= 0 || u.Per < time.Microsecond || u.Burst < 0 || a.Cost < 1 {
		return 0, 0, fmt.Errorf("%w: units %v, cost %d (N and Per > 0, Burst ≥ 0, cost ≥ 1)", ErrInvalidRate, u, a.Cost)
	}
	inc, ok1 := u.span(a.Cost, true)
	tolerance, ok2 := u.span(u.Burst, false)
	if !ok1 || !ok2 {
		return 0, 0, fmt.Errorf("%w: units %v, cost %d (too large)", ErrInvalidRate, u, a.Cost)
	}
	return inc, tolerance, nil
}

// Charge is what a take charged a queue's unit budget: what Reconcile needs to charge or
// refund the difference once the job's true cost is known.
type Charge struct {
	// Units is the budget charged, and Cost the units charged.
	Units Units
	Cost  int64
	// tat is the unit schedule's TAT right after the take, and charged its charged counter
	// (µs of units ever charged, never lowered by refunds); epoch the state's (Redis).
	tat, charged, epoch int64
	// budget is the named budget charged (TakeCosts); "" the queue's one unit budget.
	budget string
}

// CostSchedule is a Schedule with unit budgets: Memory and Redis. Implementations are safe for
// concurrent use.
type CostSchedule interface {
	Schedule
	// TakeCost reserves the queue's next slot at rate r that also has a.Cost units of
	// a.Units: one instant s that satisfies both schedules, s = max(now, the request
	// schedule's next slot, the unit schedule's next slot), from which both advance. When
	// a.Ahead > 0 and the units come later than a.Ahead from now, it reserves nothing and
	// returns a Slot that says so (WaitCost asks again after its Wait). It returns an error
	// wrapping ErrInvalidRate for an invalid r or a.
	TakeCost(ctx context.Context, queue string, r Rate, a Ask) (Slot, Charge, error)
	// Reconcile charges (actual > c.Cost) or refunds (actual < c.Cost) the difference
	// between a delivered job's true cost and its charge on the queue's unit schedule. A
	// refund never makes the schedule more permissive than charging actual at the take
	// would have (see the package doc); a charge made in a state since lost (Redis) is not
	// reconciled. actual ≥ 0.
	Reconcile(ctx context.Context, queue string, c Charge, actual int64) error
}

// reconcileSpan is the change in µs of the unit TAT that reconciling c with actual asks for
// (> 0 a charge, < 0 a refund).
func reconcileSpan(c Charge, actual int64) (int64, error) {
	if actual < 0 || c.Cost < 1 || c.Units.N <= 0 || c.Units.Per < time.Microsecond {
		return 0, fmt.Errorf("%w: reconcile %d of a charge of %d (%v)", ErrInvalidRate, actual, c.Cost, c.Units)
	}
	est, ok1 := c.Units.span(c.Cost, true)
	tru, ok2 := c.Units.span(actual, true)
	if !ok1 || !ok2 {
		return 0, fmt.Errorf("%w: reconcile %d of a charge of %d (too large)", ErrInvalidRate, actual, c.Cost)
	}
	return tru - est, nil
}

// reconciled is the unit TAT after reconciling: tat + d for a charge; for a refund
// tat + d, but never before the latest slot reserved (slot) plus every unit charged since the
// refunded job's take (charged − at), and never later than tat. The TAT is a max-plus
// recurrence, TAT_k = max(TAT_k−1, s_k) + inc_k: refunding job j's units lowers every term
// that runs through j by d, but not those that start at a later job k (s_k + Σ_{i≥k} inc_i),
// which are at most slot + (charged − at).
func reconciled(tat, d, slot, charged, at int64) int64 {
	if d >= 0 {
		return tat + d
	}
	return min(tat, max(tat+d, slot+(charged-at)))
}

// WaitCost is WaitHooks for a job that costs a.Cost units of a.Units: it waits for one slot
// of both the request rate r and the unit budget (TakeCost), asking again after a Slot that
// reserved nothing (a.Ahead), and returns the Charge to reconcile once the job's true cost is
// known. Its errors are WaitHooks'.
func WaitCost(ctx context.Context, s CostSchedule, queue string, r Rate, a Ask, h Hooks) (Charge, error) {
	w := waiter{s: s, queue: queue, rate: r, h: h, sleeper: sleeper{clock: h.Clock}}
	w.ck, _ = s.(checker)
	defer w.stop()
	for {
		if err := ctx.Err(); err != nil {
			return Charge{}, err
		}
		slot, c, err := s.TakeCost(ctx, queue, r, a)
		if err != nil {
			return Charge{}, err
		}
		if slot.retry {
			d := slot.Wait
			if a.Poll > 0 {
				d = min(d, a.Poll)
			}
			if err := w.sleep(ctx, d, h.OnWait, ProgressThreshold, ProgressInterval); err != nil {
				return Charge{}, err
			}
			continue
		}
		if ok, err := w.await(ctx, slot); ok || err != nil {
			return c, err
		}
	}
}

// TakeCost reserves the queue's next slot of rate r with a's units; see CostSchedule.
func (m *Memory) TakeCost(_ context.Context, queue string, r Rate, a Ask) (Slot, Charge, error) {
	interval, bt, err := r.micros()
	if err != nil {
		return Slot{}, Charge{}, err
	}
	inc, ut, err := a.micros()
	if err != nil {
		return Slot{}, Charge{}, err
	}
	q := m.queue(queue)
	q.mu.Lock()
	t := m.now()
	now := t.UnixMicro()
	// As lua/takecost.lua.
	tat := now
	if q.taken && q.last+interval > tat {
		tat = q.last + interval
	}
	utat := q.utat
	if q.paused {
		tat = max(tat, q.pausedUntil+bt)
		utat = max(utat, q.pausedUntil+ut)
	}
	uslot := utat - ut
	if a.Ahead > 0 && uslot > now+ceilMicros(a.Ahead) {
		q.mu.Unlock()
		wait := time.Duration(uslot-now-ceilMicros(a.Ahead)) * time.Microsecond
		return Slot{Wait: wait, At: t.Add(wait), retry: true}, Charge{}, nil
	}
	slot := max(tat-bt, now, uslot)
	q.last, q.taken = max(tat, slot), true
	q.utat = max(utat, slot) + inc
	q.uslot = max(q.uslot, slot)
	q.ucharged += inc
	c := Charge{Units: a.Units, Cost: a.Cost, tat: q.utat, charged: q.ucharged}
	q.mu.Unlock()
	wait := time.Duration(slot-now) * time.Microsecond
	return Slot{Wait: wait, At: t.Add(wait), sched: slot}, c, nil
}

// Reconcile charges or refunds the difference of a delivered job's true cost; see
// CostSchedule. It returns an error only for an invalid c or actual.
func (m *Memory) Reconcile(_ context.Context, queue string, c Charge, actual int64) error {
	d, err := reconcileSpan(c, actual)
	if err != nil || d == 0 {
		return err
	}
	q := m.queue(queue)
	q.mu.Lock()
	defer q.mu.Unlock()
	u := &unitState{q.utat, q.uslot, q.ucharged}
	if c.budget != "" {
		u = q.budget(c.budget)
	}
	u.utat = reconciled(u.utat, d, u.uslot, u.ucharged, c.charged)
	if d > 0 {
		u.ucharged += d
	}
	if c.budget == "" {
		q.utat, q.ucharged = u.utat, u.ucharged
	}
	return nil
}

var (
	//go:embed lua/takecost.lua
	takeCostLua    string
	takeCostScript = redis.NewScript(takeCostLua)

	//go:embed lua/reconcile.lua
	reconcileLua    string
	reconcileScript = redis.NewScript(reconcileLua)
)

// TakeCost reserves the queue's next slot of rate rt with a's units; see CostSchedule. One
// round trip (lua/takecost.lua), on the same key as Take.
func (r *Redis) TakeCost(ctx context.Context, queue string, rt Rate, a Ask) (Slot, Charge, error) {
	interval, _, err := rt.micros()
	if err != nil {
		return Slot{}, Charge{}, err
	}
	inc, ut, err := a.micros()
	if err != nil {
		return Slot{}, Charge{}, err
	}
	args := []any{interval, rt.Burst, inc, ut, ceilMicros(a.Ahead)}
	var fixed time.Time
	if r.now != nil {
		fixed = r.now()
		args = append(args, fixed.UnixMicro())
	}
	sent := time.Now()
	res, err := takeCostScript.Run(ctx, r.rdb, []string{r.key(queue)}, args...).Int64Slice()
	recv := time.Now()
	if err != nil {
		return Slot{}, Charge{}, fmt.Errorf("leaky: take %q: %w", queue, err)
	}
	if len(res) != 6 || res[0] < 0 {
		return Slot{}, Charge{}, fmt.Errorf("leaky: take %q: unexpected reply %v", queue, res)
	}
	wait := time.Duration(res[0]) * time.Microsecond
	if res[1] == 0 { // nothing reserved: ask again after wait
		base := fixed
		if base.IsZero() {
			base = recv
		}
		return Slot{Wait: wait, At: base.Add(wait), retry: true}, Charge{}, nil
	}
	c := Charge{Units: a.Units, Cost: a.Cost, tat: res[4], charged: res[5], epoch: res[2]}
	sched := res[3] + res[0]
	if r.now != nil {
		return Slot{Wait: wait, At: fixed.Add(wait), sched: sched, epoch: res[2]}, c, nil
	}
	cl := r.clock(queue)
	lo, hi, young := cl.observe(sent, recv, res[3])
	return Slot{Wait: wait, At: cl.local(sched, hi), early: cl.local(sched, lo), strict: young, sched: sched, epoch: res[2]}, c, nil
}

// Reconcile charges or refunds the difference of a delivered job's true cost; see
// CostSchedule. One round trip (lua/reconcile.lua). A charge is made once per take: made again
// (its first call timed out, after the server ran it or not) it changes nothing the second
// time, as long as it is among the queue's latest 4096 charges (a sorted set beside the
// queue's state, expiring with it). A refund made twice would be refunded twice: callers do
// not make a failed refund again.
func (r *Redis) Reconcile(ctx context.Context, queue string, c Charge, actual int64) error {
	d, err := reconcileSpan(c, actual)
	if err != nil || d == 0 {
		return err
	}
	key := r.key(queue)
	if c.budget != "" {
		key = r.budgetKey(queue, c.budget)
	}
	if err := reconcileScript.Run(ctx, r.rdb, []string{key, key + ":charges"}, d, c.charged, c.epoch).Err(); err != nil {
		return fmt.Errorf("leaky: reconcile %q: %w", queue, err)
	}
	return nil
}

var (
	_ CostSchedule = (*Memory)(nil)
	_ CostSchedule = (*Redis)(nil)
)
