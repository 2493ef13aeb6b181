package ingress

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/limit"
)

// maxLeases bounds each rule's leases; when it is full of live ones, a key gets no lease (its
// requests ask the store, as without lease).
const maxLeases = 65536

// leaseCache holds, for one rule with lease: N, the requests this ingress took from the shared
// store ahead of need, per key: a request that finds none asks the store for N at once (cost
// N); when that is admitted, it is admitted and the next N-1 requests of the key are admitted
// here without a round trip. When fewer than N are left in the store, the request asks for
// itself alone, so a lease never admits more than the store would have on the spot, only
// earlier: a lease is held for at most one period of the limit, and requests admitted from it
// may fall into the next window or refill. That is the bound stated in the README: at most N
// more per ingress and key. It is safe for concurrent use.
type leaseCache struct {
	n    int64
	hold time.Duration // how long a lease is kept: the limit's period

	mu sync.Mutex
	m  map[string]*lease
}

type lease struct {
	left      int64     // requests still to admit from it
	until     time.Time // when it is dropped, spent or not
	limit     int64
	remaining int64     // the store's Remaining when it was taken
	resetAt   time.Time // when the store said the quota is whole again
}

func newLeaseCache(n int64, hold time.Duration) *leaseCache {
	return &leaseCache{n: n, hold: hold, m: map[string]*lease{}}
}

// take admits one request of key from its lease, if it has one left at now.
func (c *leaseCache) take(key string, now time.Time) (limit.Decision, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok || e.left <= 0 || !now.Before(e.until) {
		return limit.Decision{}, false
	}
	e.left--
	return limit.Decision{Allowed: true, Limit: e.limit, Remaining: e.remaining + e.left,
		ResetAfter: max(e.resetAt.Sub(now), 0)}, true
}

// put keeps the N-1 requests left of a lease of key that the store admitted with d at now, and
// returns the request's own decision.
func (c *leaseCache) put(key string, d limit.Decision, now time.Time) limit.Decision {
	left := c.n - 1
	own := d
	own.Remaining += left
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[key]; ok && now.Before(e.until) {
		e.left += left // a concurrent request took a lease too: keep both
		e.remaining, e.resetAt = d.Remaining, now.Add(d.ResetAfter)
		return own
	}
	if len(c.m) >= maxLeases {
		for k, v := range c.m {
			if v.left <= 0 || !now.Before(v.until) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= maxLeases {
			return d // no room: the lease is spent on nothing, as if never taken
		}
	}
	c.m[key] = &lease{left: left, until: now.Add(c.hold), limit: d.Limit, remaining: d.Remaining,
		resetAt: now.Add(d.ResetAfter)}
	return own
}

// storeDecisions decides k's requests with the shared store: in one round trip, or none when
// every rule with a lease admits from it. A rule with a lease and none left asks for a new one
// (cost N); one the store refuses at N asks again for the request alone, in a second round
// trip for those rules only.
func (g *Gate) storeDecisions(ctx context.Context, timeout time.Duration, k *call) error {
	leased := false
	for _, ru := range k.limited {
		leased = leased || ru.leases != nil
	}
	if !leased {
		decs, err := g.askStore(ctx, timeout, k.reqs)
		if err == nil {
			copy(k.decs, decs)
		}
		return err
	}

	now := g.now()
	k.stIdx, k.stReqs = k.stIdx[:0], k.stReqs[:0]
	for i, ru := range k.limited {
		q := k.reqs[i]
		if ru.leases != nil {
			if d, ok := ru.leases.take(q.Key, now); ok {
				k.decs[i], k.srcs[i] = d, fromLease
				g.metrics.leased.Inc()
				continue
			}
			q.Cost = ru.leases.n
		}
		k.stIdx, k.stReqs = append(k.stIdx, i), append(k.stReqs, q)
	}
	if len(k.stReqs) == 0 {
		return nil
	}
	decs, err := g.askStore(ctx, timeout, k.stReqs)
	if err != nil {
		return err
	}
	again := k.fbIdx[:0] // the rules whose lease the store refused: asked again at cost 1
	for j, i := range k.stIdx {
		d, ru := decs[j], k.limited[i]
		if ru.leases != nil {
			if !d.Allowed {
				again = append(again, i)
				continue
			}
			d = ru.leases.put(k.reqs[i].Key, d, now)
		}
		k.decs[i] = d
	}
	if len(again) == 0 {
		return nil
	}
	k.stReqs = k.stReqs[:0]
	for _, i := range again {
		k.stReqs = append(k.stReqs, k.reqs[i])
	}
	if decs, err = g.askStore(ctx, timeout, k.stReqs); err != nil {
		return err
	}
	for j, i := range again {
		k.decs[i] = decs[j]
	}
	return nil
}

// askStore is callStore, checked to answer every request.
func (g *Gate) askStore(ctx context.Context, timeout time.Duration, reqs []limit.Request) ([]limit.Decision, error) {
	decs, err := g.callStore(ctx, timeout, reqs)
	if err == nil && len(decs) != len(reqs) {
		err = fmt.Errorf("limiter returned %d decisions for %d requests", len(decs), len(reqs))
	}
	return decs, err
}
