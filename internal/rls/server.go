package rls

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/httphdr"
	"github.com/sluice-rl/sluice/limit"
)

// Options are what a Server takes besides the config. The zero value of each field is its
// default.
type Options struct {
	// Limiter counts. Nil: a limit.Memory of this process. Anything else is taken to be a
	// remote store (limit.Redis): each call is bounded by the config's store_timeout, and
	// when it fails, descriptors whose on_store_error is allow are decided by an in-process
	// limit.Memory, the others answered OVER_LIMIT.
	Limiter limit.Limiter
	// Registerer receives the metrics. When it already holds the ingress's
	// sluice_decisions_total, decisions are counted there, by rule and outcome, beside the
	// HTTP path's. Nil: not exported.
	Registerer prometheus.Registerer
	// Logger receives reloads and store failures. Nil: slog.Default().
	Logger *slog.Logger
	// Now is the clock of the in-process limiters. Nil: time.Now.
	Now func() time.Time
	// RegionalLimit cuts the limit of a global rule (config.Rule.Global) behind a descriptor
	// to this region's part of it now, as the ingress's HTTP path does (the same function:
	// *regions.Holder.Limit); false refuses the descriptor without asking the limiter, for
	// the wait it returns. Nil: the whole limit.
	RegionalLimit func(rule string, spec limit.Limit) (limit.Limit, time.Duration, bool)
}

// Server answers ShouldRateLimit. It is safe for concurrent use; SetDomains and SetConfig
// swap what it decides with between calls, each call deciding entirely under one.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer

	domains  atomic.Pointer[Domains]
	cfg      atomic.Pointer[config.Config]
	lim      limit.Limiter
	fallback limit.Limiter // nil when lim is in-process
	refunds  *refunds
	regional func(rule string, spec limit.Limit) (limit.Limit, time.Duration, bool) // nil: whole limits
	m        *metrics
	log      *slog.Logger
	// dir and reflection are the config's at New: read at start only.
	dir        string
	reflection bool
}

// New builds a Server for cfg (whose RLS must be set), loading its domain files. The error
// names the file and field of every problem.
func New(cfg *config.Config, opts Options) (*Server, error) {
	if cfg.RLS == nil {
		return nil, errors.New("rls: the config has no rls section")
	}
	d, err := LoadDir(cfg.RLS.ConfigDir, cfg)
	if err != nil {
		return nil, err
	}
	s := &Server{lim: opts.Limiter, log: opts.Logger, refunds: newRefunds(opts.Now), regional: opts.RegionalLimit, dir: cfg.RLS.ConfigDir, reflection: cfg.RLS.Reflection}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.lim == nil {
		s.lim = limit.NewMemory(limit.MemoryConfig{Now: opts.Now})
	} else if _, ok := s.lim.(*limit.Memory); !ok {
		s.fallback = limit.NewMemory(limit.MemoryConfig{Now: opts.Now})
	}
	if s.m, err = newMetrics(opts.Registerer); err != nil {
		return nil, err
	}
	s.domains.Store(d)
	s.cfg.Store(cfg)
	return s, nil
}

// SetConfig makes next the config that rules, shadow, on_store_error and store_timeout are
// read from, once the domains' rules are all usable under it; else it returns why, and the
// Server keeps the config it has. The rls section itself (config_dir, reflection) is read at
// New only.
func (s *Server) SetConfig(next *config.Config) error {
	if err := s.domains.Load().Check(next); err != nil {
		return err
	}
	s.cfg.Store(next)
	return nil
}

// SetDomains makes d the domains the Server matches against.
func (s *Server) SetDomains(d *Domains) { s.domains.Store(d) }

// item is one request descriptor on its way to a status.
type item struct {
	pol      *policy
	shared   []string // see Domains.match
	spec     limit.Limit
	key      string
	cost     int64
	negative bool
	regional bool // a global rule the region's share refuses now: decided without the limiter
	peek     bool // a descriptor hits_addend of 0: check only, charge nothing
	shadow   bool
	quota    bool // quota_mode: over the limit answers OK, reported in dynamic_metadata
	failOpen bool
	dec      limit.Decision
	outcome  string // "" until decided
	over     bool   // answered OVER_LIMIT
	violated bool   // over the limit in quota mode
}

// ShouldRateLimit decides every descriptor of req: one status each, in order, and the
// overall code. It answers InvalidArgument for a request without a domain or descriptors,
// as envoyproxy/ratelimit does; store failures are answered by each descriptor's
// on_store_error, never as an error.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "rls: domain must not be empty")
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "rls: descriptor list must not be empty")
	}
	start := time.Now()
	defer func() { s.m.duration.Observe(time.Since(start).Seconds()) }()
	doms, cfg := s.domains.Load(), s.cfg.Load()
	var buf [4]item // most calls have a few descriptors: no allocation for them
	items := buf[:0]
	if len(req.Descriptors) > len(buf) {
		items = make([]item, 0, len(req.Descriptors))
	}
	items = items[:len(req.Descriptors)]
	var replaced map[string]bool // nil (and read as empty) until a limit replaces another
	for i, desc := range req.Descriptors {
		it := &items[i]
		it.pol, it.shared = doms.match(req.Domain, desc)
		if o := desc.GetLimit(); o != nil && doms.byName[req.Domain] != nil {
			it.pol = override(it.pol, o, req.Domain)
		}
		if it.pol != nil {
			for _, r := range it.pol.replaces {
				if replaced == nil {
					replaced = map[string]bool{}
				}
				replaced[r] = true
			}
		}
	}
	for i := range items {
		it := &items[i]
		if it.pol == nil || it.pol.unlimited || (it.pol.name != "" && replaced[it.pol.name]) {
			continue
		}
		desc := req.Descriptors[i]
		it.cost = int64(max(req.HitsAddend, 1))
		if h := desc.GetHitsAddend(); h != nil {
			it.cost, it.peek = int64(max(h.GetValue(), 1)), h.GetValue() == 0
		}
		it.negative = desc.GetIsNegativeHits()
		it.key = counterKey(req.Domain, desc, it.shared)
		s.resolve(it, cfg)
	}
	s.decide(ctx, cfg, items)
	return s.respond(req.Domain, items, replaced), nil
}

// override is the policy of a descriptor that carries its own limit: the matched policy's
// algorithm and counter (a fixed window for a plain rate_limit or none) at the override's
// rate. An
// override in a unit other than second, minute, hour, day, month or year is ignored.
func override(p *policy, o *rlcommon.RateLimitDescriptor_RateLimitOverride, domain string) *policy {
	period := overrideUnits[o.GetUnit()]
	if period == 0 { // a unit this service does not know: the override is ignored
		return p
	}
	if m := o.GetUnitMultiplier(); m != nil && m.GetValue() > 0 {
		period *= time.Duration(m.GetValue())
	}
	label := "rls:" + domain + ":override"
	q := &policy{label: label, sfLabel: httphdr.SFString(label), spec: limit.Limit{Algorithm: limit.FixedWindow}}
	if p != nil {
		c := *p
		q = &c
		// As there: an override is never unlimited or shadowed by the file, has no name and
		// replaces nothing. (A rule's own shadow still applies: it is the rule's.)
		q.unlimited, q.shadow, q.quota, q.name, q.replaces = false, false, false, "", nil
		q.cl = nil // its current_limit is its own: not the cache of p's
	}
	q.overrideLimit, q.overridePeriod = int64(o.GetRequestsPerUnit()), period
	return q
}

var overrideUnits = map[typev3.RateLimitUnit]time.Duration{
	typev3.RateLimitUnit_SECOND: time.Second, typev3.RateLimitUnit_MINUTE: time.Minute,
	typev3.RateLimitUnit_HOUR: time.Hour, typev3.RateLimitUnit_DAY: 24 * time.Hour,
	typev3.RateLimitUnit_MONTH: 30 * 24 * time.Hour, typev3.RateLimitUnit_YEAR: 365 * 24 * time.Hour,
}

// resolve fills in it's limit, shadow and store-error mode under cfg.
func (s *Server) resolve(it *item, cfg *config.Config) {
	p := it.pol
	it.spec = p.spec
	it.shadow, it.quota = p.shadow || cfg.Shadow, p.quota
	mode := cfg.OnStoreError
	global := false
	if p.rule != "" {
		i := slices.IndexFunc(cfg.Rules, func(r config.Rule) bool { return r.Name == p.rule })
		if i >= 0 { // SetConfig keeps it so
			r := cfg.Rules[i]
			it.spec, it.shadow, mode = r.LimitSpec(), it.shadow || r.Shadow, r.StoreErrorMode(cfg.OnStoreError)
			global = r.Global
		}
	}
	if p.overridePeriod > 0 {
		o := it.spec
		o.Limit, o.Period = p.overrideLimit, p.overridePeriod
		// An override the algorithm cannot compute exactly (limit.ErrOutOfRange) is ignored;
		// one of 0 blocks everything, as a requests_per_unit of 0 does.
		if o.Limit == 0 || o.Validate() == nil {
			it.spec = o
		}
	}
	// A global rule is decided against the region's part of its limit (of an override too:
	// the regions share whatever limit the descriptor carries), as on the HTTP path.
	if global && s.regional != nil && it.spec.Validate() == nil {
		whole := it.spec.Capacity()
		cut, wait, ok := s.regional(p.rule, it.spec)
		it.spec = cut
		if !ok || it.cost > cut.Capacity() && it.cost <= whole {
			it.regional, it.dec.RetryAfter, it.dec.ResetAfter = true, wait, wait
		}
	}
	it.failOpen = mode != config.StoreErrorDeny
}

// counterKey is the limiter key of a descriptor: the domain and every entry, as
// envoyproxy/ratelimit keys its counters (a wildcard or a bare key counts each value apart,
// unless shared names the wildcard's value for it); hashed when longer than a store takes.
func counterKey(domain string, desc *rlcommon.RateLimitDescriptor, shared []string) string {
	n := len("rls:") + len(domain)
	for _, e := range desc.GetEntries() {
		n += 2 + len(e.GetKey()) + len(e.GetValue())
	}
	var b strings.Builder
	b.Grow(n) // the one allocation of the key (a shared value is no longer than "prefix*")
	b.WriteString("rls:")
	b.WriteString(domain)
	for i, e := range desc.GetEntries() {
		b.WriteByte(0x1f)
		b.WriteString(e.GetKey())
		b.WriteByte('=')
		if shared != nil && shared[i] != "" {
			b.WriteString(shared[i])
		} else {
			b.WriteString(e.GetValue())
		}
	}
	k := b.String()
	if len(k) > limit.MaxKeyLen {
		sum := sha256.Sum256([]byte(k))
		k = "rls:" + domain[:min(len(domain), 64)] + ":" + hex.EncodeToString(sum[:])
	}
	return k
}

// decide charges (or refunds) every counted item: one store round trip for the charges.
func (s *Server) decide(ctx context.Context, cfg *config.Config, items []item) {
	reqs := make([]limit.Request, 0, len(items))
	idx := make([]int, 0, len(items))
	for i := range items {
		it := &items[i]
		switch {
		case it.pol == nil || it.key == "":
		case it.negative:
			s.refund(ctx, cfg, it)
		case it.regional:
			it.refuseForRegion()
		case it.spec.Validate() != nil || it.cost > it.spec.Capacity():
			// requests_per_unit: 0 (or an override of 0) blocks everything, as there; so does
			// a cost no window can ever admit. Neither changes within a period.
			it.over, it.outcome = true, "rejected"
			it.dec.ResetAfter, it.dec.RetryAfter = max(it.spec.Period, time.Second), max(it.spec.Period, time.Second)
		default:
			reqs = append(reqs, limit.Request{Key: it.key, Limit: it.spec, Cost: it.cost})
			idx = append(idx, i)
		}
	}
	if len(reqs) == 0 {
		return
	}
	decs, err := s.ask(ctx, cfg, s.lim, reqs)
	if err == nil {
		s.record(items, idx, decs, false)
		s.unpeek(ctx, cfg, items, idx)
		return
	}
	if ctx.Err() != nil {
		// The caller went away first (Envoy's timeout, a closed stream): no one reads the
		// answer, and the store did not fail. Counted apart; the items stay undecided.
		s.m.abandoned.Inc()
		return
	}
	s.m.storeErrors.Inc()
	s.log.Warn("rls: limiter store", "err", err)
	var open []limit.Request
	var openIdx []int
	for j, i := range idx {
		it := &items[i]
		if it.failOpen || it.shadow {
			open, openIdx = append(open, reqs[j]), append(openIdx, i)
		} else {
			it.over, it.outcome = true, "fail_closed"
		}
	}
	if len(open) == 0 || s.fallback == nil {
		return
	}
	if decs, err := s.fallback.DecideAll(ctx, open); err == nil {
		s.record(items, openIdx, decs, true)
	}
}

// refuseForRegion decides it, a descriptor of a global rule whose region's part of the limit
// admits nothing now (or not its cost), without the store: over the limit until the region's
// next renewal (it.dec, set by resolve), unless shadowed, in quota mode, or a check.
func (it *item) refuseForRegion() {
	it.over = !it.shadow && !it.quota && !it.peek
	it.violated = it.quota && !it.shadow
	switch {
	case it.peek: // a check, not a decision: not counted
	case it.shadow || it.quota:
		it.outcome = "shadow"
	default:
		it.outcome = "rejected"
	}
}

// ask asks lim for reqs, within store_timeout when lim is remote.
func (s *Server) ask(ctx context.Context, cfg *config.Config, lim limit.Limiter, reqs []limit.Request) ([]limit.Decision, error) {
	if s.fallback != nil && cfg.StoreTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.StoreTimeout)
		defer cancel()
	}
	if len(reqs) == 1 {
		d, err := lim.Decide(ctx, reqs[0].Key, reqs[0].Limit, reqs[0].Cost)
		return []limit.Decision{d}, err
	}
	return lim.DecideAll(ctx, reqs)
}

// record records decs as the decisions of items[idx...].
func (s *Server) record(items []item, idx []int, decs []limit.Decision, fellBack bool) {
	for j, i := range idx {
		it := &items[i]
		it.dec = decs[j]
		switch {
		case it.peek: // a check, not a decision: not counted
		case fellBack:
			it.outcome = "fail_open"
		case it.dec.Allowed:
			it.outcome = "allowed"
		case it.shadow || it.quota:
			it.outcome = "shadow"
		default:
			it.outcome = "rejected"
		}
		it.over = !it.dec.Allowed && !it.shadow && !it.quota && !it.peek
		it.violated = !it.dec.Allowed && it.quota && !it.shadow
		if it.dec.Allowed && !fellBack && !it.peek {
			s.refunds.add(it.key, it.spec, it.dec)
		}
	}
}

// unpeek gives back the unit that a check-only descriptor (hits_addend 0) was decided with:
// its status says whether one more would fit, and what remains, without charging anything.
// envoyproxy/ratelimit adds 0 and answers OK unless the key is already over; Sluice never
// counts a key past its limit, so a check is always OK.
func (s *Server) unpeek(ctx context.Context, cfg *config.Config, items []item, idx []int) {
	for _, i := range idx {
		it := &items[i]
		if !it.peek || !it.dec.Allowed {
			continue
		}
		actx, cancel := ctx, context.CancelFunc(func() {})
		if s.fallback != nil {
			actx, cancel = context.WithTimeout(ctx, cfg.StoreTimeout)
		}
		if err := s.lim.Adjust(actx, it.key, it.spec, it.dec, 0); err != nil {
			s.storeError(ctx, "rls: give back a check's unit", err)
		} else {
			it.dec.Remaining++
		}
		cancel()
	}
}

// refund gives back it.cost units of what recent admitted decisions of it.key charged, within
// the limit's refund rules (limit.Limiter.Adjust): is_negative_hits, and the negative half of
// an apply_on_stream_done reconciliation.
func (s *Server) refund(ctx context.Context, cfg *config.Config, it *item) {
	it.outcome = "allowed"
	left := it.cost
	for left > 0 {
		d, ok := s.refunds.take(it.key, it.spec)
		if !ok {
			break
		}
		r := min(left, d.Cost)
		actx, cancel := ctx, context.CancelFunc(func() {})
		if s.fallback != nil {
			actx, cancel = context.WithTimeout(ctx, cfg.StoreTimeout)
		}
		err := s.lim.Adjust(actx, it.key, it.spec, d, d.Cost-r)
		cancel()
		if err != nil {
			s.storeError(ctx, "rls: refund", err)
			break
		}
		left -= r
		it.dec = d
		it.dec.Remaining = min(d.Remaining+it.cost-left, it.spec.Limit)
		s.m.refunded.Add(float64(r))
	}
	if left > 0 {
		s.m.unrefunded.Add(float64(left))
	}
}

// storeError counts and logs err, the failure of a store call made for a caller whose context
// is ctx: as a store error, unless the caller went away first.
func (s *Server) storeError(ctx context.Context, msg string, err error) {
	if ctx.Err() != nil {
		s.m.abandoned.Inc()
		return
	}
	s.log.Warn(msg, "err", err)
	s.m.storeErrors.Inc()
}

// respond builds the answer to the items.
func (s *Server) respond(domain string, items []item, replaced map[string]bool) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(items))}
	// The statuses and their durations each in one allocation rather than one per descriptor.
	sts := make([]rlsv3.RateLimitResponse_DescriptorStatus, len(items))
	durs := make([]durationpb.Duration, len(items))
	tight := -1
	for i := range items {
		it := &items[i]
		st := &sts[i]
		st.Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = st
		switch {
		case it.pol == nil:
			continue
		case it.pol.unlimited: // as there: an unlimited limit stays so even when replaced
			st.LimitRemaining = math.MaxUint32
			continue
		case it.pol.name != "" && replaced[it.pol.name]:
			continue
		}
		st.CurrentLimit = it.pol.currentLimit(it.spec)
		st.LimitRemaining = uint32(min(max(it.dec.Remaining, 0), math.MaxUint32))
		st.DurationUntilReset = setDuration(&durs[i], it.dec.ResetAfter)
		if it.over {
			st.Code, st.LimitRemaining = rlsv3.RateLimitResponse_OVER_LIMIT, 0
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if it.quota {
			resp.DynamicMetadata = quotaMetadata(resp.DynamicMetadata, i, it.violated)
		}
		if it.outcome != "" {
			s.m.count(it.pol.label, it.outcome)
		}
		if tight < 0 || tighter(it, &items[tight]) {
			tight = i
		}
	}
	if tight >= 0 {
		resp.ResponseHeadersToAdd, resp.RawBody = headers(items, tight)
	}
	s.m.respond(resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT)
	return resp
}

// setDuration sets d to dur as durationpb.New would build it, and returns d.
func setDuration(d *durationpb.Duration, dur time.Duration) *durationpb.Duration {
	nanos := dur.Nanoseconds()
	d.Seconds, d.Nanos = nanos/1e9, int32(nanos%1e9)
	return d
}

// tighter reports whether a is closer to exhaustion than b: over the limit, then the longer
// wait, then fewer left.
func tighter(a, b *item) bool {
	if a.over != b.over {
		return a.over
	}
	if a.over {
		return a.dec.RetryAfter > b.dec.RetryAfter
	}
	return a.dec.Remaining < b.dec.Remaining
}
