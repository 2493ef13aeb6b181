package config

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Regions is how this deployment shares global budgets with other regions (YAML regions): a
// queue with global: true shares its rate through leases on the coordinator
// (internal/regions). Rule limits and cost_rate are not shared yet.
type Regions struct {
	// Names are the regions that share the budgets, this one (Config.Region) among them
	// (YAML names). Required.
	Names []string
	// Coordinator is the NATS (a URL or comma-separated servers) whose JetStream key-value
	// bucket holds the leases, reachable from every region (YAML coordinator). Required.
	Coordinator string
	// Home is the NATS cluster the coordinator's bucket is placed in when a region makes it
	// (YAML home): with regional NATS clusters joined by gateways into a supercluster, the
	// home region's cluster, so that every region may name its own local server as
	// coordinator and reach the one bucket through the gateways. Empty: the cluster of the
	// server the first renewal came in on (right for a coordinator of its own).
	Home string
	// SafeShare is what a region may use once its lease expired while it cannot renew (YAML
	// safe_share): even (SafeEven, the default: the budget ÷ len(Names)), 0 (a strict budget:
	// nothing) or a rate (SafeRate).
	SafeEven bool
	SafeRate Rate
	// MinShare is the least share of a budget a region with a lease gets (YAML min_share, a
	// rate). Default 0.
	MinShare Rate
	// Lease is how long a lease lasts (YAML lease). Default DefaultLease.
	Lease time.Duration
	// Renew is how often each worker renews its region's leases (YAML renew), less than
	// Lease. Default Lease/4.
	Renew time.Duration
}

// DefaultLease is how long a region's lease lasts by default.
const DefaultLease = 10 * time.Second

// clusterName is a NATS cluster's name, as regions.home names the coordinator's.
var clusterName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// regionName is a region's name: it is a key of the coordinator's records.
var regionName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)

// rawRegions is the regions section as written.
type rawRegions struct {
	Names       stringList `yaml:"names"`
	Coordinator *scalar    `yaml:"coordinator"`
	Home        *scalar    `yaml:"home"`
	SafeShare   *scalar    `yaml:"safe_share"`
	MinShare    *scalar    `yaml:"min_share"`
	Lease       *scalar    `yaml:"lease"`
	Renew       *scalar    `yaml:"renew"`
}

// regions reads region and the regions section, and checks that global queues have them.
func (b *builder) regions(c *Config, raw *rawConfig) {
	c.Region = b.text("", "region", raw.Region, "")
	if raw.Region != nil && !regionName.MatchString(c.Region) {
		b.p.addf("", "region", "region: want 1 to 32 of A-Z, a-z, 0-9, _ and -, got %q", c.Region)
	}
	if r := raw.Regions; r != nil {
		c.Regions = b.regionsSection(r, c.Region)
	}
	if (c.Region == "") != (c.Regions == nil) {
		b.p.add("", "region", "region and regions go together: name this deployment's region (region: NAME) and how the regions share budgets (regions: {names, coordinator}), or neither")
	}
	for i, q := range c.Queues {
		if q.Global && (c.Region == "" || c.Regions == nil) {
			b.p.add(place("queues", i, q.Name), "global",
				"global: true shares the queue's rate with other regions: set region: NAME and regions: {names: [...], coordinator: nats://...} at the top level, or remove global")
		}
	}
	for i, r := range c.Rules {
		if !r.Global {
			continue
		}
		where := place("rules", i, r.Name)
		switch {
		case c.Region == "" || c.Regions == nil:
			b.p.add(where, "global",
				"global: true shares the rule's limit with other regions: set region: NAME and regions: {names: [...], coordinator: nats://...} at the top level, or remove global")
		case len(r.Budgets) > 0:
			b.p.add(where, "global", "global: true shares one limit per key; a rule with budgets has several: remove global or the budgets")
		case r.Concurrency() || r.Algorithm == "":
			b.p.add(where, "global", "global: true shares a limit per period: the rule needs algorithm, limit and period (not concurrency)")
		case !queueName.MatchString(r.Name):
			b.p.addf(where, "global", "global: true names the rule's lease on the coordinator by the rule's name: want 1 to 64 of A-Z, a-z, 0-9, _ and -, got %q", r.Name)
		}
	}
}

// regionNames reads regions.names: required, each a valid name once, region among them.
func (b *builder) regionNames(r *rawRegions, region string) []string {
	names := b.list("", "regions.names", r.Names)
	if len(names) == 0 {
		b.p.add("", "regions.names", "regions.names is required: the regions that share the budgets, this one among them")
	}
	for i, n := range names {
		if !regionName.MatchString(n) {
			b.p.addf("", fmt.Sprintf("regions.names[%d]", i), "regions.names[%d]: want 1 to 32 of A-Z, a-z, 0-9, _ and -, got %q", i, n)
		} else if slices.Index(names, n) != i {
			b.p.addf("", fmt.Sprintf("regions.names[%d]", i), "regions.names[%d]: %q is listed twice", i, n)
		}
	}
	if region != "" && len(names) > 0 && !slices.Contains(names, region) {
		b.p.addf("", "regions.names", "regions.names: the region %q is not among %v", region, names)
	}
	return names
}

// safeShare reads regions.safe_share: even (true), 0, or a rate.
func (b *builder) safeShare(r *rawRegions) (even bool, rate Rate) {
	switch s := strings.TrimSpace(b.text("", "regions.safe_share", r.SafeShare, "")); s {
	case "even":
		return true, rate
	case "0":
		return false, rate
	default:
		rate, err := ParseRate(s)
		if err != nil {
			b.p.addf("", "regions.safe_share", "regions.safe_share: want even, 0 or a rate such as 10/s, got %q", s)
		}
		return false, rate
	}
}

func (b *builder) regionsSection(r *rawRegions, region string) *Regions {
	rs := &Regions{SafeEven: true}
	rs.Names = b.regionNames(r, region)
	rs.Coordinator = b.natsURL("regions.coordinator", r.Coordinator)
	if r.Home != nil {
		rs.Home = b.text("", "regions.home", r.Home, "")
		if r.Home.shape == "" && !clusterName.MatchString(rs.Home) {
			b.p.addf("", "regions.home", "regions.home: want the NATS cluster name of the home region (1 to 64 of A-Z, a-z, 0-9, _, - and .), got %q", rs.Home)
		}
	}
	if r.SafeShare != nil {
		rs.SafeEven, rs.SafeRate = b.safeShare(r)
	}
	if r.MinShare != nil {
		if s := b.text("", "regions.min_share", r.MinShare, ""); r.MinShare.shape == "" {
			rate, err := ParseRate(s)
			if err != nil {
				b.p.addf("", "regions.min_share", "regions.min_share: want a rate such as 1/s, got %q", s)
			}
			rs.MinShare = rate
		}
	}
	rs.Lease = b.positiveDuration("", "regions.lease", r.Lease, DefaultLease)
	rs.Renew = b.positiveDuration("", "regions.renew", r.Renew, rs.Lease/4)
	if rs.Renew >= rs.Lease {
		b.p.addf("", "regions.renew", "regions.renew (%s) must be shorter than regions.lease (%s): a lease is renewed before it expires", rs.Renew, rs.Lease)
	}
	if rs.Renew > 0 && rs.Renew < 100*time.Millisecond {
		b.p.add("", "regions.renew", "regions.renew must be at least 100ms")
	}
	b.boundDuration("", "regions.lease", rs.Lease, maxDuration)
	return rs
}
