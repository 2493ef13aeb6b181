package worker_test

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/leaky"
)

// slotLog records, per queue, every slot a take of a unit schedule charged units for: its
// instant (leaky.Slot.At), the instants before and after the take ran, and when its charge
// was reconciled. A test reads from it the spacing the schedule gave, which the trip of a
// delivery to the upstream (an arrival's stamp) does not move, and tells a slot given up
// (never reconciled) from one delivered. Safe for concurrent use.
type slotLog struct {
	mu    sync.Mutex
	slots map[string][]*loggedSlot
}

// loggedSlot is one charged take.
type loggedSlot struct {
	at, before, after time.Time
	wait              time.Duration // leaky.Slot.Wait: 0 is "go now", the schedule ran dry
	charge            leaky.Charge
	reconciled        time.Time // zero: not reconciled (yet, or ever: a slot given up)
}

// took records a take of queue q that ran between before and now.
func (l *slotLog) took(q string, before time.Time, s leaky.Slot, c leaky.Charge, err error) {
	if err != nil || c.Cost == 0 { // a take beyond Ask.Ahead reserves and charges nothing
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.slots == nil {
		l.slots = map[string][]*loggedSlot{}
	}
	l.slots[q] = append(l.slots[q], &loggedSlot{at: s.At, before: before, after: time.Now(), wait: s.Wait, charge: c})
}

// reconciled records that charge c of queue q has been reconciled.
func (l *slotLog) reconciled(q string, c leaky.Charge) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.slots[q] {
		if s.charge == c {
			s.reconciled = time.Now()
		}
	}
}

// of returns queue q's charged slots, in the order taken.
func (l *slotLog) of(q string) []loggedSlot {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]loggedSlot, 0, len(l.slots[q]))
	for _, s := range l.slots[q] {
		out = append(out, *s)
	}
	return out
}

// memorySlotLog is a Memory schedule whose charged slots are logged. On Memory a slot's At
// is exact to the µs the schedule counts in (it is the take's instant plus a wait in whole
// µs from it truncated to the µs: up to 1µs early).
type memorySlotLog struct {
	*leaky.Memory
	slotLog
}

func newMemorySlotLog() *memorySlotLog { return &memorySlotLog{Memory: leaky.NewMemory(nil)} }

func (m *memorySlotLog) TakeCost(ctx context.Context, q string, r leaky.Rate, a leaky.Ask) (leaky.Slot, leaky.Charge, error) {
	before := time.Now()
	s, c, err := m.Memory.TakeCost(ctx, q, r, a)
	m.took(q, before, s, c, err)
	return s, c, err
}

func (m *memorySlotLog) Reconcile(ctx context.Context, q string, c leaky.Charge, actual int64) error {
	err := m.Memory.Reconcile(ctx, q, c, actual)
	m.reconciled(q, c)
	return err
}

// redisSlotLog is a Redis schedule whose charged slots are logged. Embedding *leaky.Redis
// keeps its checks of lost state (the wait's check before a slot) as they are.
type redisSlotLog struct {
	*leaky.Redis
	slotLog
}

func newRedisSlotLog(rdb redis.Scripter, cfg leaky.RedisConfig) *redisSlotLog {
	return &redisSlotLog{Redis: leaky.NewRedis(rdb, cfg)}
}

func (r *redisSlotLog) TakeCost(ctx context.Context, q string, rt leaky.Rate, a leaky.Ask) (leaky.Slot, leaky.Charge, error) {
	before := time.Now()
	s, c, err := r.Redis.TakeCost(ctx, q, rt, a)
	r.took(q, before, s, c, err)
	return s, c, err
}

func (r *redisSlotLog) Reconcile(ctx context.Context, q string, c leaky.Charge, actual int64) error {
	err := r.Redis.Reconcile(ctx, q, c, actual)
	r.reconciled(q, c)
	return err
}
