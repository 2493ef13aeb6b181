package regions

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Holder keeps one region's leases of a set of global budgets for a process that decides
// against them itself, request by request (the ingress, for its rules with global: true):
// every renew period it renews each budget's lease on the coordinator with the demand it
// counted since the last renewal, and Fraction tells each decision what part of the budget
// the region may use now: its lease's share of it until the lease expires, then its safe
// share's. A budget is keyed as its record is on the coordinator. Safe for concurrent use;
// Fraction takes a read lock and one atomic add.
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
	budget float64      // per second
	calls  atomic.Int64 // decisions since the last renewal: the demand
	prev   float64      // the decisions per second of the renewal before; only renew touches it

	mu     sync.Mutex
	lease  Lease
	failed bool // the last renewal failed (logged once)
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
		next[k] = &holding{budget: b}
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
	b.calls.Add(1)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.budget <= 0 {
		return 1
	}
	share := b.lease.Share
	if !h.now().Before(b.lease.Expires) {
		share = h.safe(b.budget)
	}
	return math.Max(0, math.Min(1, share/b.budget))
}

// Run renews every budget's lease every renew period until ctx ends, and returns nil then.
func (h *Holder) Run(ctx context.Context) error {
	last := h.now()
	tick := time.NewTicker(h.t.Renew)
	defer tick.Stop()
	for {
		h.renew(ctx, h.now().Sub(last))
		last = h.now()
		h.next.Store(last.Add(h.t.Renew).UnixNano())
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
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

// renew renews each budget's lease once, with the decisions counted over elapsed (and the
// period before) as demand. Only Run calls it, one round at a time.
func (h *Holder) renew(ctx context.Context, elapsed time.Duration) {
	h.mu.RLock()
	keys := make(map[string]*holding, len(h.budgets))
	for k, b := range h.budgets {
		keys[k] = b
	}
	h.mu.RUnlock()
	for key, b := range keys {
		calls := b.calls.Swap(0)
		rate := 0.0
		if elapsed > 0 {
			rate = float64(calls) / elapsed.Seconds()
		}
		// The demand is the larger of the last two periods' rates: a region whose requests
		// paused for one renewal (a stall, a gap between bursts) does not give its share away
		// and wait a linger to get it back; one that stopped yields it a renewal later.
		demand := max(rate, b.prev)
		b.prev = rate
		b.mu.Lock()
		t := h.t
		t.Budget = b.budget
		b.mu.Unlock()
		rctx, cancel := context.WithTimeout(ctx, h.t.Renew)
		l, _, err := h.c.Renew(rctx, key, demand, t)
		cancel()
		b.mu.Lock()
		switch {
		case err != nil:
			if !b.failed && ctx.Err() == nil {
				h.log.Warn("regions: cannot renew the region's lease of a global budget; using it until it expires, then the safe share",
					"budget", key, "expires", b.lease.Expires, "err", err)
			}
			b.failed = true
		default:
			if b.failed {
				h.log.Info("regions: the region's lease of a global budget renews again", "budget", key)
			}
			b.failed = false
			if l.Expires.After(h.now()) { // else the coordinator waits out a lost state's leases
				b.lease = l
			}
		}
		b.mu.Unlock()
	}
}
