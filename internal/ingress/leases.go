package ingress

import (
	"context"
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
// may fall into the next window or refill. That is the bound stated in docs/http.md ("Leases"): at most N
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
		// The store's latest word, its limit too (a region's part of a global rule's limit moves).
		e.remaining, e.resetAt, e.limit = d.Remaining, now.Add(d.ResetAfter), d.Limit
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

// storeDecisions decides k's charges with the shared store: in one round trip, or none when
// every rule with a lease admits from it. A rule with a lease and none left asks for a new one
// (cost N); one the store refuses at N asks again for the request alone, in a second round
// trip for those rules only. A rule whose limit (a region's part of a global one) holds fewer
// than N asks for the request alone at once.
func (g *gate) storeDecisions(ctx context.Context, timeout time.Duration, k *call) error {
	var now time.Time // for leases only
	k.reqs, k.idx = k.reqs[:0], k.idx[:0]
	for i := range k.charges {
		ch := &k.charges[i]
		if !charged(ch) {
			continue
		}
		q := ch.req
		if l := ch.rule.leases; l != nil {
			if now.IsZero() {
				now = g.now()
			}
			if d, ok := l.take(q.Key, now); ok {
				ch.dec, ch.src = d, fromLease
				g.metrics.leased.Inc()
				continue
			}
			if l.n <= q.Limit.Capacity() { // a region's part of a global limit may hold fewer
				q.Cost = l.n
			}
		}
		k.reqs, k.idx = append(k.reqs, q), append(k.idx, i)
	}
	if len(k.reqs) == 0 {
		return nil
	}
	decs, err := g.askStore(ctx, timeout, k)
	if err != nil {
		return err
	}
	again := k.idx[:0] // the charges whose lease the store refused: asked again at cost 1
	for j, i := range k.idx {
		ch, d := &k.charges[i], decs[j]
		if l := ch.rule.leases; l != nil && k.reqs[j].Cost == l.n {
			if !d.Allowed {
				again = append(again, i) // overwrites only what this loop has read
				continue
			}
			d = l.put(ch.req.Key, d, now)
		}
		ch.dec, ch.src = d, fromStore
	}
	if len(again) == 0 {
		return nil
	}
	k.idx, k.reqs = again, k.reqs[:0]
	for _, i := range again {
		k.reqs = append(k.reqs, k.charges[i].req)
	}
	if decs, err = g.askStore(ctx, timeout, k); err != nil {
		return err
	}
	k.settle(decs, fromStore)
	return nil
}
