package rls

import (
	"hash/maphash"
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
//
// Every admitted decision is remembered, so the keys are spread over shards, each with its
// own lock and a share of maxKeys: concurrent calls on different keys rarely wait for one
// another.
type refunds struct {
	now    func() time.Time
	seed   maphash.Seed
	shards [refundShards]refundShard
}

type refundShard struct {
	mu   sync.Mutex
	keys map[string]*charges
	_    [40]byte // keeps neighbouring shards' locks off one cache line
}

// charges are a key's latest charges, oldest first: at most perKey, kept in place.
type charges struct {
	n  int
	cs [perKey]charge
}

type charge struct {
	spec limit.Limit
	dec  limit.Decision
}

const (
	perKey       = 4
	maxKeys      = 1 << 16
	refundShards = 32
)

func newRefunds(now func() time.Time) *refunds {
	if now == nil {
		now = time.Now
	}
	r := &refunds{now: now, seed: maphash.MakeSeed()}
	for i := range r.shards {
		r.shards[i].keys = map[string]*charges{}
	}
	return r
}

func (r *refunds) shard(key string) *refundShard {
	return &r.shards[maphash.String(r.seed, key)%refundShards]
}

// add remembers an admitted decision of key under spec.
func (r *refunds) add(key string, spec limit.Limit, d limit.Decision) {
	sh := r.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	cs := sh.keys[key]
	if cs == nil {
		if len(sh.keys) >= maxKeys/refundShards {
			for k := range sh.keys { // any one: Go's map order is as good as a random eviction
				delete(sh.keys, k)
				break
			}
		}
		cs = &charges{}
		sh.keys[key] = cs
	}
	if cs.n == perKey {
		copy(cs.cs[:], cs.cs[1:])
		cs.n--
	}
	cs.cs[cs.n] = charge{spec: spec, dec: d}
	cs.n++
}

// take removes and returns the latest charge of key under spec still within its period.
func (r *refunds) take(key string, spec limit.Limit) (limit.Decision, bool) {
	sh := r.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	cs := sh.keys[key]
	if cs == nil {
		return limit.Decision{}, false
	}
	now := r.now()
	for cs.n > 0 {
		cs.n--
		c := cs.cs[cs.n]
		if c.spec == spec && now.Sub(c.dec.At) < spec.Period {
			if cs.n == 0 {
				delete(sh.keys, key)
			}
			return c.dec, true
		}
	}
	delete(sh.keys, key)
	return limit.Decision{}, false
}
