package ingress

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/inflight"
	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/tracing"
	"github.com/sluice-rl/sluice/limit"
)

// Options are the parts of a Server that do not come from the config file. The zero value of
// each field is its default.
type Options struct {
	// Limiter decides requests. Nil: a limit.Memory in this process (state is not shared
	// with other processes). When it is not a *limit.Memory it is taken to be a remote store:
	// each call is given a context that ends after the config's store_timeout and is guarded
	// by a circuit breaker, with an in-process limit.Memory as the fallback of rules that fail
	// open. A remote Limiter must return once its context ends: a limit.Redis over a go-redis
	// client with ContextTimeoutEnabled, as connect.Redis builds it, does; one without it
	// waits for the client's own ReadTimeout, holding the request that long.
	Limiter limit.Limiter
	// Places holds the places of algorithm: concurrency rules. Nil: an inflight.Memory in this
	// process. When it is not an *inflight.Memory it is taken to be shared (an inflight.Redis
	// over the Limiter's Redis): each Acquire is bounded by store_timeout and guarded by the
	// circuit breaker of a remote Limiter, and rules that fail open fall back to an in-process
	// inflight.Memory with the same limits while it fails. The Server does not close it.
	Places inflight.Store
	// Enqueuer is where deferred requests and directly submitted jobs go (a *queue.Queues).
	// Nil: requests that a rule defers are answered 503, and the job API answers 503.
	Enqueuer Enqueuer
	// Registerer receives the ingress's metrics. Nil: they are kept but not exported. One
	// Registerer takes the metrics of one Server only.
	Registerer prometheus.Registerer
	// Logger receives errors and state changes. Nil: slog.Default().
	Logger *slog.Logger
	// Now is the clock of the in-process limiters and the circuit breaker. Nil: time.Now.
	Now func() time.Time
	// BreakerFailures is how many consecutive store failures open the circuit breaker.
	// Default DefaultBreakerFailures (5).
	BreakerFailures int
	// BreakerCooldown is how long the breaker stays open before it lets one probe through.
	// Default DefaultBreakerCooldown (1s).
	BreakerCooldown time.Duration
	// UpstreamTimeout bounds the wait for the upstream's response headers (the body then
	// streams for as long as it takes); a timeout is answered 504. Default 30s.
	UpstreamTimeout time.Duration
	// Transport carries forwarded requests. Nil: a transport tuned for one upstream (many
	// idle keep-alive connections).
	Transport http.RoundTripper
	// Drain tells how a queue drains now (runtime rate, learned rate, pauses), for the eta of
	// its jobs; it is read with the queue's backlog, at most once a second per queue. Nil: at
	// the config file's rate, with no pause known.
	Drain func(ctx context.Context, queue string) (Drain, error)
	// Tracer traces requests, decisions, enqueues and forwards (trace.go). Nil: tracing off,
	// and a client's traceparent passes to the upstream untouched.
	Tracer *tracing.Tracer
	// RegionalLimit cuts a global rule's limit (config.Rule.Global) to this region's part of
	// it now (*regions.Holder.Limit): each request such a rule decides is decided against the
	// limit it returns, or, when it returns false, refused without asking the limiter, with
	// the wait it returns as Retry-After (the region's share admits nothing until then). It is
	// called once per request a global rule decides, so that it may count them as the
	// region's demand. Nil: the whole limit.
	RegionalLimit func(rule string, spec limit.Limit) (limit.Limit, time.Duration, bool)
}

// gate decides each request against the rules of a configuration: it matches the request,
// charges every matching rule's limit in one limiter call, and then lets the request proceed,
// rejects it with 429, defers it to a queue (202), or refuses it with 503 when the limiter
// store is down and a rule fails closed. It sets the rate-limit headers on every response to a
// request that matched a rule with a limit.
//
// A gate is safe for concurrent use; reload swaps its rules while requests are in flight,
// each request being decided entirely under the old rules or entirely under the new.
type gate struct {
	rules    atomic.Pointer[ruleSet]
	limiter  limit.Limiter
	fallback limit.Limiter // nil when limiter is in-process
	breaker  *breaker      // nil when limiter is in-process

	places         inflight.Store // concurrency rules' places
	placesFallback inflight.Store // nil when places is in-process

	enqueuer Enqueuer
	metrics  *metrics
	log      *slog.Logger
	quiet    quietLog // the enqueue failures' log lines
	now      func() time.Time
	calls    sync.Pool // *call

	// noDefer reports paths that are never deferred (the Server's job API).
	noDefer func(path string) bool
	// fullDepths are the depths of full queues last read (fullDepth), by queue name.
	fullDepths sync.Map // string -> depthSeen
	// outlooks are the queues' last readings of backlog and drain, by queue name.
	outlooks sync.Map // string -> *outlook
	drain    func(ctx context.Context, queue string) (Drain, error)
	tr       *tracing.Tracer // nil: off
	owed     owedCharges     // extra charges the store failed, to make again (owed.go)
	// regional cuts a global rule's limit to this region's part; nil: all (RegionalLimit).
	regional func(rule string, spec limit.Limit) (limit.Limit, time.Duration, bool)
}

// newGate compiles cfg's rules and returns a gate that decides with opts.Limiter and counts
// in m. It returns an error when a rule cannot be used (only a hand-built Config can hold one).
func newGate(cfg *config.Config, opts Options, m *metrics) (*gate, error) {
	g := &gate{
		limiter:  opts.Limiter,
		enqueuer: opts.Enqueuer,
		metrics:  m,
		log:      opts.Logger,
		now:      opts.Now,
		drain:    opts.Drain,
		tr:       opts.Tracer,

		regional: opts.RegionalLimit,
	}
	if g.log == nil {
		g.log = slog.Default()
	}
	if g.now == nil {
		g.now = time.Now
	}
	overflow := func(total uint64) {
		g.log.Warn("ingress: in-memory limiter full of keys whose limits still apply; new keys share their rule's overflow limit", "total", total)
	}
	switch l := g.limiter.(type) {
	case nil:
		mem := limit.NewMemory(limit.MemoryConfig{Now: g.now, OnOverflow: overflow})
		g.limiter = mem
		m.memories.Store(&[]*limit.Memory{mem})
	case *limit.Memory:
		m.memories.Store(&[]*limit.Memory{l})
	default:
		fb := limit.NewMemory(limit.MemoryConfig{Now: g.now, OnOverflow: overflow})
		g.fallback = fb
		m.memories.Store(&[]*limit.Memory{fb})
		g.breaker = newBreaker(opts.BreakerFailures, opts.BreakerCooldown, g.now, func(s BreakerState) {
			m.breakerState.Set(float64(s))
			switch s {
			case BreakerClosed:
				g.log.Info("ingress: limiter store reachable again; circuit breaker closed")
			case BreakerHalfOpen:
				g.log.Info("ingress: probing the limiter store", "breaker", s.String())
			default:
				g.log.Warn("ingress: limiter store failing; deciding in-process until it answers", "breaker", s.String())
			}
		})
	}
	switch p := opts.Places.(type) {
	case nil:
		g.places = inflight.NewMemory()
	case *inflight.Memory:
		g.places = p
	default:
		g.places, g.placesFallback = p, inflight.NewMemory()
	}
	g.calls.New = func() any { return new(call) }
	rs, err := compile(cfg, m)
	if err != nil {
		return nil, err
	}
	g.store(rs)
	return g, nil
}

// store makes rs the current rules, and shares the in-process limiters' key budget among its
// rules with a limit, so that a flood of keys under one rule leaves the others their share.
func (g *gate) store(rs *ruleSet) {
	n := 0
	for _, ru := range rs.rules {
		if ru.hasLimit {
			n++
		}
	}
	for _, mem := range *g.metrics.memories.Load() {
		mem.SetScopes(n)
	}
	g.rules.Store(rs)
}

// reload compiles cfg's rules and swaps them in atomically. On error the gate keeps its
// rules. Limiter state is kept: a rule that keeps its name keeps its counters, under its
// new limit.
func (g *gate) reload(cfg *config.Config) error {
	rs, err := compile(cfg, g.metrics)
	if err != nil {
		return err // the process's reloader counts it (sluice_config_reload_errors_total)
	}
	g.store(rs)
	return nil
}

// warn logs what in cfg is valid but likely wrong (config.Config.Warnings).
func (g *gate) warn(cfg *config.Config) {
	for _, w := range cfg.Warnings() {
		g.log.Warn("ingress: config: " + w)
	}
}

// verdict is what happens to a request.
type verdict uint8

const (
	forward    verdict = iota // pass it on
	reject                    // 429
	failClosed                // 503: the store is down and a rule fails closed
	deferIt                   // 202: to a queue
)

// check decides the request of c. It reports true when the request may proceed, with the
// rate-limit headers to set on its response (nil when no rule with a limit matched), and the
// concurrency places it holds in h, which the caller must give back (g.release) once the
// request's answer is finished. Otherwise it has answered the request itself, or returns the
// error to answer (a client that went away), and h holds nothing.
func (g *gate) check(c echo.Context, h *held) (bool, *rateHeaders, error) {
	r := c.Request()
	if _, err := cleanPath(r.URL); err != nil {
		writeProblem(c.Response(), problemFor(err))
		return false, nil, nil
	}
	r.Method = canonicalMethod(r.Method)
	rs := g.rules.Load()
	submit := r.Method == http.MethodPost && isJobAPI(r.URL.Path)
	if p := scrubHeaders(r.Header, rs.keyHeaders, rs.underscoreKeys, submit); p != nil {
		writeProblem(c.Response(), p)
		return false, nil, nil
	}
	if len(rs.rules) == 0 {
		return true, nil, nil
	}
	k := g.calls.Get().(*call)
	defer func() {
		k.reset()
		g.calls.Put(k)
	}()
	for _, ru := range rs.rules {
		if ru.match.matches(r.Method, r.URL.Path) {
			k.matched = append(k.matched, ru)
		}
	}
	if len(k.matched) == 0 {
		return true, nil, nil
	}
	start := g.traceStart()
	if p, err := g.chargeRules(r, rs, k); p != nil || err != nil {
		if p != nil {
			writeProblem(c.Response(), p)
		}
		return false, nil, err
	}
	mayDefer := g.noDefer == nil || !g.noDefer(r.URL.Path)
	rl := decideRuling(k.charges, k.matched, mayDefer, k.viol)
	if len(k.conc) > 0 && rl.action == forward && mayDefer {
		// The rate rules let it through: now the places, which a refused request never takes.
		if err := g.takePlaces(r.Context(), rs, k, h); err != nil {
			g.release(h)
			return false, nil, err
		}
		k.charges = append(k.charges, k.conc...)
		rl = decideRuling(k.charges, k.matched, mayDefer, rl.viol)
	}
	k.viol = rl.viol
	g.decided(r.Context(), start, k, &rl)
	var hdrs *rateHeaders
	if rl.header >= 0 {
		hdrs = g.headersOf(k, &rl)
	}
	countDecisions(k, &rl)
	if rs.logDecisions {
		g.logDecisions(r, k, &rl)
	}
	ok, hdrs, err := g.respond(c, rs, k, &rl, hdrs)
	if !ok {
		g.release(h)
		return ok, hdrs, err
	}
	k.reconciles(h)
	return ok, hdrs, err
}

// headersOf makes the rate-limit headers of the policy rl reports. The Retry-After of a 429 is
// the longest of the violated rate rules'; a 429 of concurrency rules has none.
func (g *gate) headersOf(k *call, rl *ruling) *rateHeaders {
	ch := &k.charges[rl.header]
	if ch.rule.conc != nil {
		return newInFlightHeaders(ch.rule, ch.dec)
	}
	secs := int64(-1)
	if rl.action == reject {
		secs = retryAfterSeconds(rl.retryAfter)
	}
	return newRateHeaders(ch.rule, ch.dec, secs)
}

// logDecisions writes the access log of decisions (log_decisions: true): one line per charged
// rule, with a hash of its key (not the key: it may hold an API key), the outcome and the
// status the request is answered with (0: the upstream's).
func (g *gate) logDecisions(r *http.Request, k *call, rl *ruling) {
	status := map[verdict]int{forward: 0, reject: http.StatusTooManyRequests,
		failClosed: http.StatusServiceUnavailable, deferIt: http.StatusAccepted}[rl.action]
	for i := range k.charges {
		ch := &k.charges[i]
		o, ok := decisionOutcome(ch, rl)
		outcome := o.String()
		switch {
		case ch.src == notCharged: // another rule's cached rejection, or a budget refunded
			outcome = "not_charged"
		case !ok:
			outcome = "enqueued"
		}
		sum := sha256.Sum256([]byte(ch.req.Key))
		g.log.Info("ingress: decision", "rule", ch.rule.name, "key", hex.EncodeToString(sum[:8]),
			"outcome", outcome, "remaining", ch.dec.Remaining, "status", status,
			"method", r.Method, "path", r.URL.Path)
	}
}

// chargeRules builds a charge, with its limiter key, for every matching rule with a limit and
// decides them all in one limiter call. It returns a 400 problem for a request whose key is
// ambiguous (a key header or parameter repeated with different values), and the error of a
// client that went away.
func (g *gate) chargeRules(r *http.Request, rs *ruleSet, k *call) (*Problem, error) {
	k.q = request{r: r, trusted: rs.trusted, v6bits: rs.v6bits}
	var ends [16]int
	keyEnds := ends[:0]
	for _, ru := range k.matched {
		if ru.hasLimit || ru.conc != nil {
			k.charges = append(k.charges, charge{rule: ru})
			k.keys = ru.appendKey(k.keys, &k.q)
			keyEnds = append(keyEnds, len(k.keys))
		}
	}
	if k.q.conflict != "" {
		return badRequest("ambiguous rate-limit key",
			"the "+k.q.conflict+" appears several times with different values; send it once"), nil
	}
	if len(k.charges) == 0 {
		return nil, nil
	}
	all := string(k.keys) // one allocation for every key of the request
	start := 0
	for i := range k.charges {
		ch := &k.charges[i]
		ch.req = limit.Request{Key: all[start:keyEnds[i]], Limit: ch.rule.spec, Cost: 1}
		start = keyEnds[i]
		if c := ch.rule.cost; c != nil {
			n, p := k.requestCost(r, c, g.metrics)
			if p != nil {
				return p, nil
			}
			ch.req.Cost = n
		}
		if ch.rule.global && g.regional != nil {
			g.cutToRegion(ch)
		}
	}
	k.splitConcurrency()
	if len(k.charges) == 0 {
		return nil, nil
	}
	if err := g.decide(r.Context(), rs, k); err != nil {
		return nil, err
	}
	g.refundBudgets(r.Context(), rs.storeTimeout, k)
	return nil, nil
}

// splitConcurrency moves the charges of concurrency rules from k.charges to k.conc, keeping
// the order of each.
func (k *call) splitConcurrency() {
	n := 0
	for i := range k.charges {
		if ch := k.charges[i]; ch.rule.conc != nil {
			k.conc = append(k.conc, ch)
		} else {
			k.charges[n] = ch
			n++
		}
	}
	clear(k.charges[n:])
	k.charges = k.charges[:n]
}
