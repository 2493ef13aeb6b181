package regions

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// atomicFloat is a float64 read and written atomically.
type atomicFloat struct{ bits atomic.Uint64 }

func (f *atomicFloat) Load() float64   { return math.Float64frombits(f.bits.Load()) }
func (f *atomicFloat) Store(v float64) { f.bits.Store(math.Float64bits(v)) }

// Holder keeps one region's leases of a set of global budgets for a process that decides
// against them itself, request by request (the ingress, for its rules with global: true):
// every renew period it renews each budget's lease on the coordinator with the demand it
// counted over the last renew period, and Fraction tells each decision what part of the
// budget the region may use now: its lease's share of it until the lease expires, then its
// safe share's. A budget is keyed as its record is on the coordinator. Safe for concurrent
// use; Fraction takes a read lock and one mutex.
type Holder struct {
	c    *Coordinator
	safe func(budget float64) float64 // the safe share of a budget, per second
	t    Terms                        // Minimum, Lease, Renew, Lingers; Budget per key
	now  func() time.Time
	log  *slog.Logger

	mu      sync.RWMutex
	budgets map[string]*holding
	next    atomic.Int64 // when the next round of renewals is due, Unix nanoseconds; 0: unknown
}

// holding is the region's lease of one budget.
type holding struct {
	budget float64     // per second
	demand atomicFloat // the demand the last renewal reported

	mu       sync.Mutex
	calls    meter // the decisions: the demand
	lease    Lease
	failed   bool      // the last renewal failed (logged once)
	started  time.Time // when the holder began keeping the budget: without a lease since then
	failures int64     // renewals that failed since the holder began keeping the budget
}

// NewHolder returns a holder renewing on c under t (its Budget is ignored: each budget has its
// own), with safe giving the safe share of a budget (per second), logging to log (nil: none).
func NewHolder(c *Coordinator, t Terms, safe func(budget float64) float64, log *slog.Logger) *Holder {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Holder{c: c, safe: safe, t: t, now: c.now, log: log, budgets: map[string]*holding{}}
}

// Set makes budgets (per second, by key) the ones the holder keeps: new ones start without a
// lease, changed ones keep theirs until the next renewal, missing ones are dropped.
func (h *Holder) Set(budgets map[string]float64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	next := make(map[string]*holding, len(budgets))
	for k, b := range budgets {
		if old, ok := h.budgets[k]; ok {
			old.mu.Lock()
			old.budget = b
			old.mu.Unlock()
			next[k] = old
			continue
		}
		next[k] = &holding{budget: b, started: h.now(), calls: meter{slot: max(h.t.Renew/meterSlots, time.Millisecond)}}
	}
	h.budgets = next
}

// Fraction counts one decision against key's budget and returns the part of the budget the
// region may use now, in [0, 1]: its lease's share ÷ the budget, or once the lease expired
// (or before the first) its safe share's. 1 for a key the holder does not keep.
func (h *Holder) Fraction(key string) float64 {
	h.mu.RLock()
	b := h.budgets[key]
	h.mu.RUnlock()
	if b == nil {
		return 1
	}
	now := h.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls.add(now)
	if b.budget <= 0 {
		return 1
	}
	share := b.lease.Share
	if !now.Before(b.lease.Expires) {
		share = h.safe(b.budget)
	}
	return math.Max(0, math.Min(1, share/b.budget))
}

// Run keeps every budget's lease until ctx ends, and returns nil then: each budget renewed
// every renew period, and in between when a change of its record makes a renewal matter
// (Coordinator.Watch, Wants) or budget it is short of frees up (Lease.Retry); each released
// when Run returns or the budget is dropped (Set).
func (h *Holder) Run(ctx context.Context) error {
	running := map[*holding]context.CancelFunc{}
	var wg sync.WaitGroup
	defer func() {
		for _, stop := range running {
			stop()
		}
		wg.Wait()
	}()
	tick := time.NewTicker(h.t.Renew)
	defer tick.Stop()
	for {
		h.mu.RLock()
		keys := make(map[*holding]string, len(h.budgets))
		for k, b := range h.budgets {
			keys[b] = k
		}
		h.mu.RUnlock()
		for b, key := range keys {
			if _, ok := running[b]; !ok {
				kctx, stop := context.WithCancel(ctx)
				running[b] = stop
				wg.Go(func() { h.keep(kctx, key, b) })
			}
		}
		for b, stop := range running {
			if _, ok := keys[b]; !ok {
				stop()
				delete(running, b)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// keepGap is the least time between two renewals of one budget asked by its record's changes.
const keepGap = 100 * time.Millisecond

// keep keeps key's lease until ctx ends (Run), then releases it. Every quarter of a renew
// period it checks the decisions' rate, and renews at once when it moved far from the demand
// last reported (demandChanged): a region whose requests stopped yields its share within
// about half a renew period and a check, not at its next period's end.
func (h *Holder) keep(ctx context.Context, key string, b *holding) {
	p := NewPacer(keepGap)
	go h.c.Watch(ctx, key, func() Terms { return h.terms(b) }, p.Soon)
	go func() {
		tick := time.NewTicker(max(h.t.Renew/meterSlots, time.Millisecond))
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				b.mu.Lock()
				rate, budget := b.calls.rate(h.now()), b.budget
				b.mu.Unlock()
				if demandChanged(rate, b.demand.Load(), budget) {
					p.Soon(h.now())
				}
			}
		}
	}()
	p.Run(ctx, h.t.Renew, func(ctx context.Context, periodic bool) bool {
		if periodic {
			h.next.Store(h.now().Add(h.t.Renew).UnixNano())
		}
		return h.renewKey(ctx, key, b, p)
	})
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.t.Renew)
	defer cancel()
	_ = h.c.Release(rctx, key, h.terms(b))
}

// terms are the holder's terms for b's budget.
func (h *Holder) terms(b *holding) Terms {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := h.t
	t.Budget = b.budget
	return t
}

// untilRenewal is how long until the next round of renewals is due: at most a renew period.
func (h *Holder) untilRenewal() time.Duration {
	d := h.t.Renew
	if n := h.next.Load(); n != 0 {
		if until := time.Unix(0, n).Sub(h.now()); until > 0 && until < d {
			d = until
		}
	}
	return d
}

// renew renews each budget's lease once.
func (h *Holder) renew(ctx context.Context) {
	h.mu.RLock()
	keys := make(map[string]*holding, len(h.budgets))
	for k, b := range h.budgets {
		keys[k] = b
	}
	h.mu.RUnlock()
	for key, b := range keys {
		h.renewKey(ctx, key, b, nil)
	}
}

// renewKey renews key's lease once, with the decisions' rate over the last renew period as
// the demand, and reports whether it lost a race to another writer first. A lease short of
// its target asks p (if any) for a renewal when the budget frees up (Lease.Retry).
func (h *Holder) renewKey(ctx context.Context, key string, b *holding, p *Pacer) bool {
	b.mu.Lock()
	demand := b.calls.rate(h.now())
	b.mu.Unlock()
	b.demand.Store(demand)
	t := h.terms(b)
	rctx, cancel := context.WithTimeout(ctx, t.Deadline())
	l, _, err := h.c.Renew(rctx, key, demand, t, func(share float64) { b.lower(share, h.now()) })
	cancel()
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		if !b.failed && ctx.Err() == nil {
			h.log.Warn("regions: cannot renew the region's lease of a global budget; using it until it expires, then the safe share",
				"budget", key, "expires", b.lease.Expires, "err", err)
		}
		b.failed = true
		b.failures++
		return false
	}
	if b.failed {
		h.log.Info("regions: the region's lease of a global budget renews again", "budget", key)
	}
	b.failed = false
	if l.Expires.After(h.now()) { // else the coordinator waits out a lost state's leases
		b.lease = l
	}
	if p != nil && !l.Retry.IsZero() {
		p.Soon(l.Retry.Add(RetryLag))
	}
	return l.Raced
}

// RetryLag is how long after the instant a renewal named (Lease.Retry) a holder renews again:
// past it by the coordinator's clock, should the two differ by a little.
const RetryLag = 20 * time.Millisecond

// lower applies share at now if it is below the lease's unexpired share: Coordinator.Renew
// calls it before a write that may lower the holder's acknowledged share.
func (b *holding) lower(share float64, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Before(b.lease.Expires) && share < b.lease.Share {
		b.lease.Share = share
	}
}

// Held is what the region holds of one budget at an instant, as a holder sees it (metrics).
type Held struct {
	Key     string
	Share   float64   // per second the region may use: its lease's share, or its safe share once that expired
	Expires time.Time // when the lease the holder last renewed expires; zero before the first
	OnSafe  bool      // no unexpired lease: the safe share applies
	// Lost: on the safe share for longer than a lease and a renew period, the threshold of the
	// workers' sluice_region_lease_lost (docs/regions.md): a holder that starts while the
	// coordinator's record is new waits a lease (the hold) and up to a renewal for its first.
	Lost     bool
	Failures int64 // renewals that failed since the holder began keeping the budget
}

// Leases returns what the holder holds of each of its budgets now, by key.
func (h *Holder) Leases() []Held {
	h.mu.RLock()
	defer h.mu.RUnlock()
	now := h.now()
	out := make([]Held, 0, len(h.budgets))
	for k, b := range h.budgets {
		b.mu.Lock()
		hd := Held{Key: k, Share: b.lease.Share, Expires: b.lease.Expires, Failures: b.failures}
		if !now.Before(b.lease.Expires) {
			since := b.started
			if b.lease.Expires.After(since) {
				since = b.lease.Expires
			}
			hd.Share, hd.OnSafe = h.safe(b.budget), true
			hd.Lost = now.Sub(since) > h.t.Lease+h.t.Renew
		}
		b.mu.Unlock()
		out = append(out, hd)
	}
	return out
}
