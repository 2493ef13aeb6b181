package inflight

import (
	"context"
	"crypto/rand"
	"sync"
	"time"
)

// Memory is a Store in one process. The zero value is not ready; use NewMemory. It is safe
// for concurrent use.
//
// Every call takes one mutex. Expired places of a key are dropped when the key is next touched
// (an Acquire, a Release or InFlight of it); a key with no place left is deleted; and keys left
// holding only expired places are swept as new keys arrive, each time the number of keys has
// doubled, so memory follows the places held, not the keys ever seen.
type Memory struct {
	mu      sync.Mutex
	keys    map[string]*places
	sweepAt int // len(keys) at which the next sweep of idle keys runs
	base    time.Time
	waiters waiters
}

// places are the held places of one key: lease id → expiry, in ns since the store's base
// (monotonic).
type places struct {
	exp map[string]int64
	// min is the earliest expiry in exp, or a lower bound of it after a release.
	min int64
	// exact reports whether min is exact.
	exact bool
}

// minSweep is the number of keys below which Memory does not sweep idle keys.
const minSweep = 64

// NewMemory returns an empty Memory.
func NewMemory() *Memory {
	return &Memory{keys: make(map[string]*places), sweepAt: minSweep, base: time.Now()}
}

func (m *Memory) clock() int64 { return int64(time.Since(m.base)) }

// drop removes the places of p that expired by now.
func (p *places) drop(now int64) {
	if now < p.min {
		return
	}
	p.min, p.exact = 0, true
	first := true
	for id, e := range p.exp {
		if e <= now {
			delete(p.exp, id)
			continue
		}
		if first || e < p.min {
			p.min, first = e, false
		}
	}
}

// earliest returns the exact earliest expiry of p's places (p is not empty).
func (p *places) earliest() int64 {
	if !p.exact {
		first := true
		for _, e := range p.exp {
			if first || e < p.min {
				p.min, first = e, false
			}
		}
		p.exact = true
	}
	return p.min
}

// Acquire takes a place of every cap, or none; see [Store]. It returns an error only for
// invalid input.
func (m *Memory) Acquire(_ context.Context, caps []Cap, hold time.Duration) (Result, error) {
	if err := check(caps, hold); err != nil {
		return Result{}, wrap("acquire", err)
	}
	res := Result{InFlight: make([]int64, len(caps))}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	full := false
	for i, c := range caps {
		p := m.keys[c.Key]
		if p == nil {
			continue
		}
		p.drop(now)
		n := int64(len(p.exp))
		res.InFlight[i] = n
		if n >= c.Limit {
			full = true
			res.RetryAfter = max(res.RetryAfter, time.Duration(p.earliest()-now))
		}
	}
	if full {
		for _, c := range caps {
			if p := m.keys[c.Key]; p != nil && len(p.exp) == 0 {
				delete(m.keys, c.Key)
			}
		}
		return res, nil
	}
	exp := now + int64(hold)
	id := rand.Text()
	for i, c := range caps {
		p := m.keys[c.Key]
		if p == nil {
			m.sweep(now)
			p = &places{exp: make(map[string]int64, 1), min: exp, exact: true}
			m.keys[c.Key] = p
		}
		if len(p.exp) == 0 {
			p.min, p.exact = exp, true
		} else if exp < p.min {
			p.min = exp
		}
		p.exp[id] = exp
		res.InFlight[i]++
	}
	res.Acquired = true
	res.Lease = Lease{ID: id, Keys: keysOf(caps)}
	return res, nil
}

// sweep deletes the keys whose places have all expired, once the number of keys has doubled
// since the last sweep, so that it costs O(1) per new key amortised.
func (m *Memory) sweep(now int64) {
	if len(m.keys) < m.sweepAt {
		return
	}
	for k, p := range m.keys {
		p.drop(now)
		if len(p.exp) == 0 {
			delete(m.keys, k)
		}
	}
	m.sweepAt = max(minSweep, 2*len(m.keys))
}

// Release gives l's places back and wakes the waiters of its keys; see [Store]. It never
// fails.
func (m *Memory) Release(_ context.Context, l Lease) error {
	freed := false
	m.mu.Lock()
	now := m.clock()
	for _, k := range l.Keys {
		p := m.keys[k]
		if p == nil {
			continue
		}
		e, ok := p.exp[l.ID]
		if !ok {
			continue
		}
		delete(p.exp, l.ID)
		if len(p.exp) == 0 {
			delete(m.keys, k)
		} else if e == p.min {
			p.exact = false
		}
		if e > now {
			freed = true
		}
	}
	m.mu.Unlock()
	if freed {
		for _, k := range l.Keys {
			m.waiters.wakeKey(k)
		}
	}
	return nil
}

// Wait blocks until a place of every cap is acquired or ctx ends; see [Store]. A waiter is
// woken by each Release of one of its keys and by the expiry of the earliest place of a full
// cap.
func (m *Memory) Wait(ctx context.Context, caps []Cap, hold time.Duration) (Result, error) {
	if err := check(caps, hold); err != nil {
		return Result{}, wrap("wait", err)
	}
	return wait(ctx, &m.waiters, caps, 0, func(ctx context.Context) (Result, error) {
		return m.Acquire(ctx, caps, hold)
	})
}

// InFlight returns the places held under each key; it never fails.
func (m *Memory) InFlight(_ context.Context, keys ...string) ([]int64, error) {
	out := make([]int64, len(keys))
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	for i, k := range keys {
		if p := m.keys[k]; p != nil {
			p.drop(now)
			out[i] = int64(len(p.exp))
			if len(p.exp) == 0 {
				delete(m.keys, k)
			}
		}
	}
	return out, nil
}

// Len returns the number of keys the store holds state for (for tests and metrics).
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.keys)
}

var _ Store = (*Memory)(nil)
