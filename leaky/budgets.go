package leaky

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Named budgets.
//
// A queue may have several unit budgets (input and output tokens, say), each named, with its
// own unit schedule: a job waits for one slot that satisfies the request rate and every
// budget at once (TakeCosts), and each budget's charge is reconciled on its own (Reconcile
// with that budget's Charge). Redis keeps each budget in its own key,
// {<prefix>leak:<queue>}:budget:<name>, in the queue's hash slot, so one script reserves
// them all atomically (lua/takecosts.lua). A budget's model is the queue's unit budget's
// (TakeCost): the same tolerance, the same refund clamp, its own epoch.

// BudgetSchedule is a CostSchedule whose queues may have several named unit budgets: Memory
// and Redis. Implementations are safe for concurrent use.
type BudgetSchedule interface {
	CostSchedule
	// TakeCosts reserves the queue's next slot at rate r that also has each ask's units of
	// its budget (Ask.Budget, distinct and not empty): one instant s = max(now, the request
	// schedule's slot, every budget's slot), from which all advance. Ahead and Poll are
	// asks[0]'s: when some budget's units come later than Ahead from now, nothing is
	// reserved. The charges, one per ask in order, reconcile each budget (Reconcile).
	TakeCosts(ctx context.Context, queue string, r Rate, asks []Ask) (Slot, []Charge, error)
}

var (
	_ BudgetSchedule = (*Memory)(nil)
	_ BudgetSchedule = (*Redis)(nil)
)

// checkAsks validates asks for TakeCosts and returns each one's increment and tolerance.
func checkAsks(asks []Ask) (inc, tol []int64, err error) {
	if len(asks) == 0 {
		return nil, nil, fmt.Errorf("%w: no budget asked", ErrInvalidRate)
	}
	seen := make(map[string]bool, len(asks))
	inc, tol = make([]int64, len(asks)), make([]int64, len(asks))
	for i, a := range asks {
		if a.Budget == "" || seen[a.Budget] {
			return nil, nil, fmt.Errorf("%w: budget %q empty or asked twice", ErrInvalidRate, a.Budget)
		}
		seen[a.Budget] = true
		if inc[i], tol[i], err = a.micros(); err != nil {
			return nil, nil, fmt.Errorf("budget %q: %w", a.Budget, err)
		}
	}
	return inc, tol, nil
}

// WaitCosts is WaitCost for a job charged on several named budgets (TakeCosts): it returns
// one Charge per ask, in order. Its errors are WaitHooks'.
func WaitCosts(ctx context.Context, s BudgetSchedule, queue string, r Rate, asks []Ask, h Hooks) ([]Charge, error) {
	if len(asks) == 0 {
		return nil, fmt.Errorf("%w: no budget asked", ErrInvalidRate)
	}
	w := waiter{s: s, queue: queue, rate: r, h: h, sleeper: sleeper{clock: h.Clock}}
	w.ck, _ = s.(checker)
	defer w.stop()
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		slot, cs, err := s.TakeCosts(ctx, queue, r, asks)
		if err != nil {
			return nil, err
		}
		if slot.retry {
			d := slot.Wait
			if asks[0].Poll > 0 {
				d = min(d, asks[0].Poll)
			}
			if err := w.sleep(ctx, d, h.OnWait, ProgressThreshold, ProgressInterval); err != nil {
				return nil, err
			}
			continue
		}
		if ok, err := w.await(ctx, slot); ok || err != nil {
			return cs, err
		}
	}
}

// unitState is one named budget's unit schedule in Memory: memQueue's utat, uslot, ucharged.
type unitState struct{ utat, uslot, ucharged int64 }

// budget returns q's state of the named budget; q.mu is held.
func (q *memQueue) budget(name string) *unitState {
	if q.budgets == nil {
		q.budgets = make(map[string]*unitState)
	}
	u := q.budgets[name]
	if u == nil {
		u = new(unitState)
		q.budgets[name] = u
	}
	return u
}

// TakeCosts reserves the queue's next slot of rate r with each ask's units; see
// BudgetSchedule.
func (m *Memory) TakeCosts(_ context.Context, queue string, r Rate, asks []Ask) (Slot, []Charge, error) {
	interval, bt, err := r.micros()
	if err != nil {
		return Slot{}, nil, err
	}
	inc, tol, err := checkAsks(asks)
	if err != nil {
		return Slot{}, nil, err
	}
	q := m.queue(queue)
	q.mu.Lock()
	t := m.now()
	now := t.UnixMicro()
	// As lua/takecosts.lua.
	tat := now
	if q.taken && q.last+interval > tat {
		tat = q.last + interval
	}
	if q.paused {
		tat = max(tat, q.pausedUntil+bt)
	}
	slot := max(tat-bt, now)
	utats := make([]int64, len(asks))
	latest := now
	for i, a := range asks {
		utats[i] = q.budget(a.Budget).utat
		if q.paused {
			utats[i] = max(utats[i], q.pausedUntil+tol[i])
		}
		latest = max(latest, utats[i]-tol[i])
	}
	if ahead := ceilMicros(asks[0].Ahead); asks[0].Ahead > 0 && latest > now+ahead {
		q.mu.Unlock()
		wait := time.Duration(latest-now-ahead) * time.Microsecond
		return Slot{Wait: wait, At: t.Add(wait), retry: true}, nil, nil
	}
	slot = max(slot, latest)
	q.last, q.taken = max(tat, slot), true
	cs := make([]Charge, len(asks))
	for i, a := range asks {
		u := q.budget(a.Budget)
		u.utat = max(utats[i], slot) + inc[i]
		u.uslot = max(u.uslot, slot)
		u.ucharged += inc[i]
		cs[i] = Charge{Units: a.Units, Cost: a.Cost, tat: u.utat, charged: u.ucharged, budget: a.Budget}
	}
	q.mu.Unlock()
	wait := time.Duration(slot-now) * time.Microsecond
	return Slot{Wait: wait, At: t.Add(wait), sched: slot}, cs, nil
}

var (
	//go:embed lua/takecosts.lua
	takeCostsLua    string
	takeCostsScript = redis.NewScript(takeCostsLua)
)

// budgetKey is the key of a queue's named budget, in the queue's hash slot.
func (r *Redis) budgetKey(queue, budget string) string { return r.key(queue) + ":budget:" + budget }

// TakeCosts reserves the queue's next slot of rate rt with each ask's units; see
// BudgetSchedule. One round trip (lua/takecosts.lua), on the queue's key and one key per
// budget, all in one hash slot.
func (r *Redis) TakeCosts(ctx context.Context, queue string, rt Rate, asks []Ask) (Slot, []Charge, error) {
	interval, _, err := rt.micros()
	if err != nil {
		return Slot{}, nil, err
	}
	inc, tol, err := checkAsks(asks)
	if err != nil {
		return Slot{}, nil, err
	}
	keys := []string{r.key(queue)}
	args := []any{interval, rt.Burst, ceilMicros(asks[0].Ahead), int64(-1)}
	var fixed time.Time
	if r.now != nil {
		fixed = r.now()
		args[3] = fixed.UnixMicro()
	}
	for i, a := range asks {
		keys = append(keys, r.budgetKey(queue, a.Budget))
		args = append(args, inc[i], tol[i])
	}
	sent := time.Now()
	res, err := takeCostsScript.Run(ctx, r.rdb, keys, args...).Int64Slice()
	recv := time.Now()
	if err != nil {
		return Slot{}, nil, fmt.Errorf("leaky: take %q: %w", queue, err)
	}
	if len(res) < 4 || res[0] < 0 || res[1] == 1 && len(res) != 4+3*len(asks) {
		return Slot{}, nil, fmt.Errorf("leaky: take %q: unexpected reply %v", queue, res)
	}
	wait := time.Duration(res[0]) * time.Microsecond
	if res[1] == 0 { // nothing reserved: ask again after wait
		base := fixed
		if base.IsZero() {
			base = recv
		}
		return Slot{Wait: wait, At: base.Add(wait), retry: true}, nil, nil
	}
	cs := make([]Charge, len(asks))
	for i, a := range asks {
		o := 4 + 3*i
		cs[i] = Charge{Units: a.Units, Cost: a.Cost, tat: res[o], charged: res[o+1], epoch: res[o+2], budget: a.Budget}
	}
	sched := res[3] + res[0]
	if r.now != nil {
		return Slot{Wait: wait, At: fixed.Add(wait), sched: sched, epoch: res[2]}, cs, nil
	}
	cl := r.clock(queue)
	lo, hi, young := cl.observe(sent, recv, res[3])
	return Slot{Wait: wait, At: cl.local(sched, hi), early: cl.local(sched, lo), strict: young, sched: sched, epoch: res[2]}, cs, nil
}
