package app

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/connect"
	"github.com/sluice-rl/sluice/internal/regions"
	"github.com/sluice-rl/sluice/internal/worker"
	"github.com/sluice-rl/sluice/limit"
)

// regionsDeps connects to the coordinator of cfg's regions and returns the worker pool's part
// in global budgets, and the connection to close when the pool is done; nil, nil without
// regions. The connection retries in the background: a coordinator down at start leaves the
// region on its safe share until it answers. A change of the regions section takes a restart.
func regionsDeps(cfg *config.Config, log *slog.Logger) (*worker.Regions, *nats.Conn, error) {
	nc, err := coordinatorConn(cfg, log)
	if nc == nil || err != nil {
		return nil, nil, err
	}
	w, err := leaseDeps(cfg, nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return w, nc, nil
}

// coordinatorConn connects to the coordinator of cfg's regions; nil without regions. The
// connection retries in the background.
func coordinatorConn(cfg *config.Config, log *slog.Logger) (*nats.Conn, error) {
	rs := cfg.Regions
	if rs == nil || cfg.Region == "" {
		return nil, nil
	}
	nc, err := connect.NATS(rs.Coordinator, "sluice-regions-"+cfg.Region, log.With("nats", "regions.coordinator"))
	if err != nil {
		return nil, connect.ConfigError(err)
	}
	return nc, nil
}

// leaseDeps is the worker pool's part in cfg's global budgets, renewing over nc, a connection
// to the coordinator; nil with nc nil.
func leaseDeps(cfg *config.Config, nc *nats.Conn) (*worker.Regions, error) {
	if nc == nil {
		return nil, nil
	}
	rs := cfg.Regions
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	w := &worker.Regions{Coordinator: newCoordinator(cfg, js), Regions: len(rs.Names),
		SafeShare: rs.SafeRate.PerSecond(), MinShare: rs.MinShare.PerSecond(), Lease: rs.Lease, Renew: rs.Renew}
	if rs.SafeEven {
		w.SafeShare = -1
	}
	return w, nil
}

// newCoordinator renews cfg's region's leases over js, a JetStream context on the coordinator,
// making the bucket in regions.home when it is missing.
func newCoordinator(cfg *config.Config, js jetstream.JetStream) *regions.Coordinator {
	return regions.NewCoordinator(js, cfg.Region, nil).Home(cfg.Regions.Home)
}

// connectCoordinator connects the ingress to the regions' coordinator: the admin API reads the
// leases there (GET /v1/regions), and the in-process workers renew them; none without regions.
func (p *ingressProc) connectCoordinator(context.Context) error {
	nc, err := coordinatorConn(p.current.Load(), p.log)
	p.coordinator = nc
	return err
}

// ruleLeases is the ingress's holder of its region's leases of the global rules' limits, or nil
// without regions: every rule with global: true is decided against the region's part of its
// limit (ingress.Options.RegionalLimit, rls.Options.RegionalLimit). The coordinator's connection must be open.
func (p *ingressProc) ruleLeases() *regions.Holder {
	cfg := p.current.Load()
	if p.coordinator == nil {
		return nil
	}
	js, err := jetstream.New(p.coordinator)
	if err != nil {
		return nil
	}
	rs := cfg.Regions
	safe := func(budget float64) float64 {
		if rs.SafeEven {
			return budget / float64(max(len(rs.Names), 1))
		}
		return min(rs.SafeRate.PerSecond(), budget)
	}
	h := regions.NewHolder(newCoordinator(cfg, js), regions.Terms{Minimum: rs.MinShare.PerSecond(),
		Lease: rs.Lease, Renew: rs.Renew, Lingers: ruleLingers}, safe, p.log.With("rules", "global"))
	h.Set(ruleBudgets(cfg))
	return h
}

// ruleLingers is how long the ingress's lowered part of a global rule stays counted after the
// write that lowered it (regions.Terms.Lingers): the holder applies the lower part before the
// write, so what is left are the decisions that read the former part just before and reach
// their Redis after, within a scheduling delay and a round trip to it.
const ruleLingers = 200 * time.Millisecond

// ruleBudgets are cfg's global rules' limits per key, per second, keyed as the coordinator
// keeps their records: ruleKey.
func ruleBudgets(cfg *config.Config) map[string]float64 {
	out := map[string]float64{}
	for _, r := range cfg.Rules {
		if r.Global && r.Period > 0 {
			out[ruleKey(r.Name)] = float64(r.Limit) / r.Period.Seconds()
		}
	}
	return out
}

// ruleKey is the key of a global rule's record on the coordinator: "rule." and its name (a
// queue's name, its record's key, holds no dot).
func ruleKey(rule string) string { return "rule." + rule }

// readRegions reads a global queue's record on the coordinator, for GET /v1/regions.
func (p *ingressProc) readRegions(ctx context.Context, queue string) (regions.Record, bool, error) {
	if p.coordinator == nil {
		return regions.Record{}, false, nil
	}
	js, err := jetstream.New(p.coordinator)
	if err != nil {
		return regions.Record{}, false, err
	}
	return regions.Read(ctx, js, queue)
}

// closeCoordinator closes the connection to the regions' coordinator, if any.
func closeCoordinator(nc *nats.Conn) {
	if nc != nil {
		nc.Close()
	}
}

func (p *workerProc) closeCoordinator(context.Context) error {
	closeCoordinator(p.coordinator)
	return nil
}
func (p *ingressProc) closeCoordinator(context.Context) error {
	closeCoordinator(p.coordinator)
	return nil
}

// regionalLimit cuts a global rule's limit to the region's part of it now, for the HTTP path
// and the Envoy rate-limit service alike: one holder, one count of the region's demand.
func (p *ingressProc) regionalLimit(rule string, spec limit.Limit) (limit.Limit, time.Duration, bool) {
	return p.holder.Limit(ruleKey(rule), spec)
}

// ruleLeaseMetrics exports the ingress's leases of its global rules' limits, as the workers
// export theirs of the global queues' rates (docs/regions.md, "Metrics"), by rule. It reads
// the holder of the moment: a reload that rebuilds the front keeps one registration.
type ruleLeaseMetrics struct{ holder func() *regions.Holder }

var (
	descRuleShare = prometheus.NewDesc("sluice_region_rule_share",
		"Requests per second per key this ingress's region may admit of a global rule's limit now: its lease's share, or its safe share once the lease expired unrenewed. By rule.", []string{"rule"}, nil)
	descRuleExpiry = prometheus.NewDesc("sluice_region_rule_lease_expiry_timestamp_seconds",
		"When the region's lease of a global rule's limit, as this ingress last renewed it, expires (Unix seconds; 0 before the first). By rule.", []string{"rule"}, nil)
	descRuleOnSafe = prometheus.NewDesc("sluice_region_rule_on_safe_share",
		"1 while this ingress decides a global rule against its region's safe share (no lease yet, or its lease expired unrenewed), else 0. By rule.", []string{"rule"}, nil)
	descRuleLost = prometheus.NewDesc("sluice_region_rule_lease_lost",
		"1 while this ingress has held no lease of a global rule's limit for longer than a lease and a renew period, else 0: the alert. By rule.", []string{"rule"}, nil)
	descRuleFailures = prometheus.NewDesc("sluice_region_rule_renewal_failures_total",
		"Renewals of the region's lease of a global rule's limit that failed (coordinator out of reach). By rule.", []string{"rule"}, nil)
)

func (m ruleLeaseMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRuleShare, descRuleExpiry, descRuleOnSafe, descRuleLost, descRuleFailures} {
		ch <- d
	}
}

func (m ruleLeaseMetrics) Collect(ch chan<- prometheus.Metric) {
	h := m.holder()
	if h == nil {
		return
	}
	one := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	for _, l := range h.Leases() {
		rule := strings.TrimPrefix(l.Key, "rule.")
		expiry := 0.0
		if !l.Expires.IsZero() {
			expiry = float64(l.Expires.UnixNano()) / 1e9
		}
		ch <- prometheus.MustNewConstMetric(descRuleShare, prometheus.GaugeValue, l.Share, rule)
		ch <- prometheus.MustNewConstMetric(descRuleExpiry, prometheus.GaugeValue, expiry, rule)
		ch <- prometheus.MustNewConstMetric(descRuleOnSafe, prometheus.GaugeValue, one(l.OnSafe), rule)
		ch <- prometheus.MustNewConstMetric(descRuleLost, prometheus.GaugeValue, one(l.Lost), rule)
		ch <- prometheus.MustNewConstMetric(descRuleFailures, prometheus.CounterValue, float64(l.Failures), rule)
	}
}
