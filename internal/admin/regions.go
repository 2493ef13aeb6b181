package admin

import (
	"context"
	"net/http"
	"slices"
	"sort"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/regions"
)

// Regions serves GET /v1/regions: each global queue's and global rule's regional leases as
// the coordinator holds them (docs/regions.md).
//
//	{"region":"eu","regions":["eu","us"],"coordinator":"ok","lease_seconds":10,"renew_seconds":2.5,
//	 "queues":[{"queue":"llm","budget":50,"held":50,"safe_share":25,"hold_until":…,
//	            "leases":[{"region":"eu","share":40,"expires":…,"demand":…,"renewed":…,
//	                       "held":40,"on_safe_share":false,"lost":false}, …]}],
//	 "rules":[{"rule":"per-key","budget":16.67,…, "leases":[…]}]}
//
// A region is on_safe_share while it holds no unexpired lease (its workers use the safe
// share once the lease they last renewed expired), and lost once that has lasted longer than
// a lease and a renew period, as the workers' sluice_region_lease_lost (a region that never
// renewed is not lost: it has no renewed time). Every region of
// regions.names is listed, in that order, with or without a lease. Without regions the
// answer is {"region":"","regions":[],"queues":[],"rules":[]}. A rule's budget is its limit
// per key, per second. When the coordinator cannot be read,
// coordinator says why (to holders of the admin token; others read "unavailable") and the
// budgets are listed without leases. It costs one read of the coordinator's bucket per global
// queue and rule, each bounded by DefaultCheckTimeout.
type Regions struct {
	// Config returns the current config: its region, regions and global queues. Required.
	Config func() *config.Config
	// Read reads a global budget's record on the coordinator (regions.Read) by its key (a
	// queue's name; "rule." and a rule's name), and false when there is none yet. Optional:
	// nil reads none, as with no coordinator.
	Read func(ctx context.Context, key string) (regions.Record, bool, error)
	// Now is the clock that judges expiries. Nil: time.Now.
	Now func() time.Time

	srv *Server // set by Mount: the admin token of reading errors
}

// RegionsStatus is the body of GET /v1/regions.
type RegionsStatus struct {
	Region       string         `json:"region"`
	Regions      []string       `json:"regions"`
	Coordinator  string         `json:"coordinator,omitempty"` // "ok", or why it could not be read
	LeaseSeconds float64        `json:"lease_seconds,omitempty"`
	RenewSeconds float64        `json:"renew_seconds,omitempty"`
	Queues       []GlobalBudget `json:"queues"`
	// Rules are the rules with global: true: their limits per key, shared the same way.
	Rules []GlobalBudget `json:"rules"`
}

// GlobalBudget is one global queue's budget and its regions' leases.
type GlobalBudget struct {
	// Queue or Rule names the global queue or rule.
	Queue string `json:"queue,omitempty"`
	Rule  string `json:"rule,omitempty"`
	// Budget is the global rate (this region's config), deliveries per second; Held what the
	// regions' leases count for now (never more than Budget); SafeShare what a region runs on
	// without a lease.
	Budget    float64 `json:"budget"`
	Held      float64 `json:"held"`
	SafeShare float64 `json:"safe_share"`
	// HoldUntil is set while a record the coordinator made afresh hands out nothing.
	HoldUntil *time.Time    `json:"hold_until,omitempty"`
	Leases    []RegionLease `json:"leases"`
}

// RegionLease is one region's lease of a global budget.
type RegionLease struct {
	Region string `json:"region"`
	// Share is the lease's deliveries per second until Expires; Held what it counts for now.
	Share   float64    `json:"share"`
	Expires *time.Time `json:"expires,omitempty"`
	Held    float64    `json:"held"`
	// Demand is what the region last reported (its backlog drained within a renew period, per
	// second), at Renewed.
	Demand  float64    `json:"demand"`
	Renewed *time.Time `json:"renewed,omitempty"`
	// OnSafeShare: the region holds no unexpired lease; Lost: its lease expired longer than a
	// lease and a renew period ago.
	OnSafeShare bool `json:"on_safe_share"`
	Lost        bool `json:"lost"`
}

// Mount serves GET /v1/regions on s.
func (rg *Regions) Mount(s *Server) {
	rg.srv = s
	s.Handle("GET /v1/regions", http.HandlerFunc(rg.serve))
}

func (rg *Regions) serve(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, rg.status(r.Context(), rg.srv != nil && rg.srv.holder(r)))
}

// status reads every global queue's record; holder sees the coordinator's errors.
func (rg *Regions) status(ctx context.Context, holder bool) RegionsStatus {
	cfg := rg.Config()
	out := RegionsStatus{Region: cfg.Region, Regions: []string{}, Queues: []GlobalBudget{}, Rules: []GlobalBudget{}}
	rs := cfg.Regions
	if rs == nil || cfg.Region == "" {
		return out
	}
	now := time.Now
	if rg.Now != nil {
		now = rg.Now
	}
	out.Regions = slices.Clone(rs.Names)
	out.LeaseSeconds, out.RenewSeconds = rs.Lease.Seconds(), rs.Renew.Seconds()
	out.Coordinator = "ok"
	for _, q := range cfg.Queues {
		if q.Global {
			gb := GlobalBudget{Queue: q.Name, Budget: q.Rate.PerSecond()}
			out.Queues = append(out.Queues, rg.budget(ctx, &out, rs, gb, q.Name, holder, now))
		}
	}
	for _, r := range cfg.Rules {
		if r.Global && r.Period > 0 {
			gb := GlobalBudget{Rule: r.Name, Budget: float64(r.Limit) / r.Period.Seconds()}
			out.Rules = append(out.Rules, rg.budget(ctx, &out, rs, gb, "rule."+r.Name, holder, now))
		}
	}
	return out
}

// budget fills in gb (its budget set) from the record at key, read unless a read failed
// before, as of now() after the read; a failed read sets out.Coordinator.
func (rg *Regions) budget(ctx context.Context, out *RegionsStatus, rs *config.Regions, gb GlobalBudget, key string, holder bool, now func() time.Time) GlobalBudget {
	gb.Leases = []RegionLease{}
	if rs.SafeEven {
		gb.SafeShare = gb.Budget / float64(max(len(rs.Names), 1))
	} else {
		gb.SafeShare = min(rs.SafeRate.PerSecond(), gb.Budget)
	}
	if rg.Read == nil || out.Coordinator != "ok" {
		return gb
	}
	rctx, cancel := context.WithTimeout(ctx, DefaultCheckTimeout)
	rec, _, err := rg.Read(rctx, key)
	cancel()
	if err != nil {
		out.Coordinator = unavailable
		if holder {
			out.Coordinator = err.Error()
		}
		return gb
	}
	t := now() // after the read: a renewal during it must not look unexpired
	gb.Held = rec.Held(t)
	if t.Before(rec.HoldUntil) {
		gb.HoldUntil = new(rec.HoldUntil)
	}
	names := slices.Clone(rs.Names)
	var extra []string
	for name := range rec.Leases {
		if !slices.Contains(names, name) {
			extra = append(extra, name)
		}
	}
	sort.Strings(extra)
	for _, name := range append(names, extra...) {
		l := rec.Leases[name]
		rl := RegionLease{Region: name, Share: l.Share, Held: rec.Holds(name, t), Demand: l.Demand,
			OnSafeShare: !t.Before(l.Expires)}
		if !l.Expires.IsZero() {
			rl.Expires = new(l.Expires)
		}
		if !l.Renewed.IsZero() {
			rl.Renewed = new(l.Renewed)
		}
		rl.Lost = rl.OnSafeShare && !l.Renewed.IsZero() && t.Sub(l.Expires) > rs.Lease+rs.Renew
		gb.Leases = append(gb.Leases, rl)
	}
	return gb
}
