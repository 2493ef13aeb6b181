package leaky

import (
	"context"
	"sync"
	"time"
)

// Memory is a Schedule kept in process memory, for the one-process quickstart: it coordinates
// the goroutines of one process only. It has the semantics of Redis, in integer microseconds of
// its clock. Its state is never lost and never expires (a few dozen bytes per queue ever used).
//
// A Memory is safe for concurrent use; takes on different queues do not contend. Its methods
// never return an error other than ErrInvalidRate from Take, and ignore ctx.
type Memory struct {
	now func() time.Time

	mu     sync.RWMutex
	queues map[string]*memQueue

	adaptMu sync.Mutex
	adapt   map[string]*learned // the queues' learned rates (Adapt)

	tenantsMu sync.Mutex
	tenants   map[string]map[string]int64 // queue → paused tenant → until, µs (TenantPauses)
}

// memQueue is one queue's state; the fields mean what the hash fields of lua/take.lua mean.
type memQueue struct {
	mu          sync.Mutex
	last        int64 // µs, TAT of the most recent reservation; valid when taken
	taken       bool
	pausedUntil int64 // µs; valid when paused
	paused      bool
	// The unit schedule (TakeCost): utat, µs, its TAT; uslot, µs, the latest slot a TakeCost
	// reserved; ucharged, µs of units ever charged (never lowered by refunds).
	utat, uslot, ucharged int64
	// budgets are the named budgets' unit schedules (TakeCosts), by name.
	budgets map[string]*unitState
}

// NewMemory returns an empty in-memory schedule reading the time from now (nil = time.Now).
func NewMemory(now func() time.Time) *Memory {
	if now == nil {
		now = time.Now
	}
	return &Memory{now: now, queues: make(map[string]*memQueue)}
}

func (m *Memory) queue(name string) *memQueue {
	m.mu.RLock()
	q := m.queues[name]
	m.mu.RUnlock()
	if q != nil {
		return q
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if q = m.queues[name]; q == nil {
		q = new(memQueue)
		m.queues[name] = q
	}
	return q
}

// Take reserves the queue's next slot at rate r; see Schedule.
func (m *Memory) Take(_ context.Context, queue string, r Rate) (Slot, error) {
	interval, bt, err := r.micros()
	if err != nil {
		return Slot{}, err
	}
	q := m.queue(queue)
	q.mu.Lock()
	t := m.now()
	now := t.UnixMicro()
	// As lua/take.lua.
	tat := now
	if q.taken && q.last+interval > tat {
		tat = q.last + interval
	}
	if q.paused && q.pausedUntil+bt > tat {
		tat = q.pausedUntil + bt
	}
	slot := max(tat-bt, now)
	q.last, q.taken = tat, true
	q.mu.Unlock()
	wait := time.Duration(slot-now) * time.Microsecond
	return Slot{Wait: wait, At: t.Add(wait), sched: slot}, nil
}

// Pause pauses the queue for d from now; see Schedule. It never returns an error.
func (m *Memory) Pause(_ context.Context, queue string, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	q := m.queue(queue)
	q.mu.Lock()
	defer q.mu.Unlock()
	want := m.now().UnixMicro() + ceilMicros(d)
	if !q.paused || want > q.pausedUntil {
		q.pausedUntil, q.paused = want, true
	}
	return nil
}

// PausedFor reports how long the queue stays paused; see Schedule. It never returns an error.
func (m *Memory) PausedFor(_ context.Context, queue string) (time.Duration, error) {
	m.mu.RLock()
	q := m.queues[queue]
	m.mu.RUnlock()
	if q == nil {
		return 0, nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.paused {
		return 0, nil
	}
	return time.Duration(max(q.pausedUntil-m.now().UnixMicro(), 0)) * time.Microsecond, nil
}

var _ Schedule = (*Memory)(nil)
