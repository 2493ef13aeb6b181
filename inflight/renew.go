package inflight

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Renewer extends the places of a lease it gave out. Memory and Redis are Renewers.
type Renewer interface {
	// Renew makes every place of l expire hold from now (never earlier than it did) and
	// reports true, when they are all still held; when one has expired or was released it
	// gives the others back and reports false: the holder must Acquire again. One round trip
	// on Redis.
	Renew(ctx context.Context, l Lease, hold time.Duration) (bool, error)
}

var (
	//go:embed lua/renew.lua
	renewLua    string
	renewScript = redis.NewScript(renewLua)
)

// Renew extends l's places; see [Renewer].
func (r *Redis) Renew(ctx context.Context, l Lease, hold time.Duration) (bool, error) {
	if hold <= 0 {
		return false, wrap("renew", ErrInvalidHold)
	}
	if l.ID == "" || len(l.Keys) == 0 {
		return false, nil
	}
	keys, err := r.keys(l.Keys)
	if err != nil {
		return false, wrap("renew", err)
	}
	ok, err := renewScript.Run(ctx, r.rdb, keys, l.ID, int64((hold+time.Microsecond-1)/time.Microsecond)).Int64()
	if err != nil {
		return false, fmt.Errorf("inflight: renew %.64q: %w", l.Keys[0], err)
	}
	return ok == 1, nil
}

// Renew extends l's places; see [Renewer]. It fails only for invalid input.
func (m *Memory) Renew(_ context.Context, l Lease, hold time.Duration) (bool, error) {
	if hold <= 0 {
		return false, wrap("renew", ErrInvalidHold)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	for _, k := range l.Keys {
		p := m.keys[k]
		if p == nil {
			return m.dropLease(l), nil
		}
		if e, ok := p.exp[l.ID]; !ok || e <= now {
			return m.dropLease(l), nil
		}
	}
	want := now + int64(hold)
	for _, k := range l.Keys {
		p := m.keys[k]
		if e := p.exp[l.ID]; e < want {
			if e == p.min {
				p.exact = false
			}
			p.exp[l.ID] = want
		}
	}
	return true, nil
}

// dropLease removes l from every key; m.mu is held. It returns false, Renew's answer.
func (m *Memory) dropLease(l Lease) bool {
	for _, k := range l.Keys {
		if p := m.keys[k]; p != nil {
			if e, ok := p.exp[l.ID]; ok {
				delete(p.exp, l.ID)
				if len(p.exp) == 0 {
					delete(m.keys, k)
				} else if e == p.min {
					p.exact = false
				}
			}
		}
	}
	return false
}
