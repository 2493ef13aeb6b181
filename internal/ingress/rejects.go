package ingress

import (
	"sync"
	"time"

	"github.com/sluice-rl/sluice/limit"
)

// maxCachedRejects bounds each rule's cache of rejected keys; when it is full of live entries,
// a new rejection is simply not cached (its requests ask the store, as without a cache).
const maxCachedRejects = 65536

// rejectCache remembers, for one rule, the keys the shared limiter store rejected and until
// when. Under every algorithm of the limit package a rejected key stays rejected until its
// RetryAfter has passed — other ingresses can only spend more of its quota, never give any back —
// so until then the ingress may answer 429 for the key without asking Redis: exact, and no round
// trip. It is per rule (a reload builds new rules and so drops every cache) and safe for
// concurrent use.
type rejectCache struct {
	mu sync.RWMutex
	m  map[string]cachedReject
}

type cachedReject struct {
	until   time.Time // when the key may be allowed again
	resetAt time.Time // when its quota is whole again
	limit   int64
}

func newRejectCache() *rejectCache { return &rejectCache{m: map[string]cachedReject{}} }

// get returns the decision for a key rejected until after now.
func (c *rejectCache) get(key string, now time.Time) (limit.Decision, bool) {
	c.mu.RLock()
	e, ok := c.m[key]
	c.mu.RUnlock()
	if !ok || !now.Before(e.until) {
		return limit.Decision{}, false
	}
	return limit.Decision{Allowed: false, Limit: e.limit, Remaining: 0,
		RetryAfter: e.until.Sub(now), ResetAfter: max(e.resetAt.Sub(now), e.until.Sub(now))}, true
}

// put remembers the rejection d of key decided at now.
func (c *rejectCache) put(key string, d limit.Decision, now time.Time) {
	if d.Allowed || d.RetryAfter <= 0 {
		return
	}
	e := cachedReject{until: now.Add(d.RetryAfter), resetAt: now.Add(d.ResetAfter), limit: d.Limit}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= maxCachedRejects {
		for k, v := range c.m { // drop what has expired; if nothing has, do not cache
			if !now.Before(v.until) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= maxCachedRejects {
			return
		}
	}
	c.m[key] = e
}

// cachedRejection decides the request of k from the rules' reject caches when one of its rules
// that rejects (not shadow, not on_limit: enqueue) has its key cached as rejected: the request
// is rejected whatever the store would say, so it is not asked, and the other rules are not
// charged (notCharged). It reports whether it decided.
func (g *gate) cachedRejection(k *call) bool {
	now := g.now()
	hit := false
	for i := range k.charges {
		ch := &k.charges[i]
		if ru := ch.rule; ru.rejects == nil || ru.shadow || ru.onLimitEnqueue || !charged(ch) {
			continue
		}
		// A rejection under a smaller limit does not hold under this one: a region's part of
		// a global rule's limit has grown since (gate.cutToRegion).
		if d, ok := ch.rule.rejects.get(ch.req.Key, now); ok && d.Limit >= ch.req.Limit.Limit {
			ch.dec, ch.src, hit = d, fromCache, true
		}
	}
	if !hit {
		return false
	}
	for i := range k.charges {
		if ch := &k.charges[i]; ch.src != fromCache && charged(ch) {
			ch.src = notCharged
		}
	}
	g.metrics.cachedRejects.Inc()
	return true
}

// rememberRejections caches the store's rejections of k's rules that reject.
func (g *gate) rememberRejections(k *call) {
	var now time.Time
	for i := range k.charges {
		ch := &k.charges[i]
		if ru := ch.rule; !ch.dec.Allowed && charged(ch) && ru.rejects != nil && !ru.shadow && !ru.onLimitEnqueue {
			if now.IsZero() {
				now = g.now()
			}
			ru.rejects.put(ch.req.Key, ch.dec, now)
		}
	}
}
