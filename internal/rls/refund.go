package rls

import (
	"sync"
	"time"

	"github.com/sluice-rl/sluice/limit"
)

// refunds remembers this process's recent admitted charges per counter key, so that an
// is_negative_hits descriptor can give back what they charged with limit.Limiter.Adjust,
// which finds a charge by its decision. A charge is kept for its limit's period (a refund
// later than that returns nothing under any algorithm's refund rules), at most perKey per key
// (the latest) and maxKeys keys (beyond that, any one key is forgotten for each new one); a
// refund of a forgotten charge does nothing. At about 150 bytes a charge, that bounds it to
// some 40 MB.
type refunds struct {
	mu   sync.Mutex
	now  func() time.Time
	keys map[string][]charge
}

type charge struct {
	spec limit.Limit
	dec  limit.Decision
}

const (
	perKey  = 4
	maxKeys = 1 << 16
)

func newRefunds(now func() time.Time) *refunds {
	if now == nil {
		now = time.Now
	}
	return &refunds{now: now, keys: map[string][]charge{}}
}

// add remembers an admitted decision of key under spec.
func (r *refunds) add(key string, spec limit.Limit, d limit.Decision) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cs := r.keys[key]
	if cs == nil && len(r.keys) >= maxKeys {
		for k := range r.keys { // any one: Go's map order is as good as a random eviction
			delete(r.keys, k)
			break
		}
	}
	if len(cs) >= perKey {
		cs = append(cs[:0], cs[1:]...)
	}
	r.keys[key] = append(cs, charge{spec: spec, dec: d})
}

// take removes and returns the latest charge of key under spec still within its period.
func (r *refunds) take(key string, spec limit.Limit) (limit.Decision, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cs := r.keys[key]
	now := r.now()
	for len(cs) > 0 {
		c := cs[len(cs)-1]
		cs = cs[:len(cs)-1]
		if c.spec == spec && now.Sub(c.dec.At) < spec.Period {
			r.store(key, cs)
			return c.dec, true
		}
	}
	r.store(key, cs)
	return limit.Decision{}, false
}

func (r *refunds) store(key string, cs []charge) {
	if len(cs) == 0 {
		delete(r.keys, key)
		return
	}
	r.keys[key] = cs
}
