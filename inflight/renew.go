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
	renewScript = redis.NewScript(epochLua + renewLua)
)

// Renew extends l's places; see [Renewer]. A lease lost with the server's state is put back
// first while the fence after the loss stands (then renewed), and reported lost after it.
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
	ek, fenced := r.epochKey(keys[0])
	var fenceFor int64
	if fenced {
		keys, fenceFor = append(keys, ek), micros(r.fenceFor(hold))
	}
	for try := 0; ; try++ {
		start := time.Now()
		known := ""
		if fenced {
			known = r.known(ek, start)
		}
		v, err := renewScript.Run(ctx, r.rdb, keys, l.ID, micros(hold), known, fenceFor, r.cluster).Slice()
		status, epoch, err := parseStatus(v, err)
		if err != nil {
			return false, fmt.Errorf("inflight: renew %.64q: %w", l.Keys[0], err)
		}
		if !fenced {
			return status == 1, nil
		}
		r.saw(ctx, ek, l.Keys[0], epoch, start, hold, "", nil)
		switch {
		case status == 1:
			r.renewed(ek, l.ID, hold, time.Now().Add(hold))
			return true, nil
		case status == 0 || try > 0:
			r.forget(keys[0], l.ID)
			return false, nil
		}
	}
}

// renewed records that lease id of group ek is held until expires, for hold.
func (r *Redis) renewed(ek, id string, hold time.Duration, expires time.Time) {
	r.gmu.Lock()
	defer r.gmu.Unlock()
	if g := r.groups[ek]; g != nil {
		if o := g.leases[id]; o != nil && expires.After(o.expires) {
			o.expires, o.hold = expires, hold
		}
	}
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
