package ingress

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/inflight"
	"github.com/sluice-rl/sluice/internal/config"
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
	now      func() time.Time
	calls    sync.Pool // *call

	// noDefer reports paths that are never deferred (the Server's job API).
	noDefer func(path string) bool
	// fullDepths are the depths of full queues last read (fullDepth), by queue name.
	fullDepths sync.Map // string -> depthSeen
	// outlooks are the queues' last readings of backlog and drain, by queue name.
	outlooks sync.Map // string -> *outlook
	drain    func(ctx context.Context, queue string) (Drain, error)
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

// breakerState reports the state of the circuit breaker in front of the limiter store;
// always BreakerClosed for an in-process limiter.
func (g *gate) breakerState() BreakerState {
	if g.breaker == nil {
		return BreakerClosed
	}
	return g.breaker.current()
}

// source says where a rule's decision came from.
type source uint8

const (
	fromStore    source = iota // the limiter
	fromFallback               // the in-process fallback, the store having failed
	failedOpen                 // no decision at all; the rule fails open
	failedClosed               // no decision at all; the rule fails closed
	fromCache                  // a rejection remembered from the store (rejectCache)
	notCharged                 // not charged: another rule's cached rejection decided
	fromLease                  // admitted from requests taken from the store ahead (leaseCache)
)

// charge is one matching rule with a limit, charged for one request: what the limiter is
// asked (the request's key under the rule, the rule's limit, a cost of 1), what it decided,
// and where that decision came from.
type charge struct {
	rule *rule
	req  limit.Request
	dec  limit.Decision
	src  source
}

// call is the scratch state of one request, pooled: after the first requests, deciding one
// allocates only the string of its keys.
type call struct {
	q       request
	matched []*rule  // every matching rule
	charges []charge // the matching rules with a limit, in rule order; then those of conc
	keys    []byte   // the keys of the charges, end to end, before they become one string

	// conc are the matching concurrency rules, in rule order, decided after the others
	// (takePlaces); caps is the argument of their Acquire.
	conc []charge
	caps [1]inflight.Cap

	// reqs are the requests of one limiter call, for the charges at the same indexes in idx:
	// all of them, or those that a lease, the reject cache or the store's failure left.
	reqs []limit.Request
	idx  []int
	one  [1]limit.Decision // the decision of a call of one request (ask)

	viol []*rule // the rules a 429 names
	body []byte  // a 429's body

	costBody costBody // the request's body, read ahead for a cost
}

func (c *call) reset() {
	c.q = request{}
	clear(c.matched)
	clear(c.charges)
	clear(c.reqs)
	clear(c.viol)
	clear(c.conc)
	c.caps[0] = inflight.Cap{}
	c.matched, c.charges, c.keys, c.conc = c.matched[:0], c.charges[:0], c.keys[:0], c.conc[:0]
	c.reqs, c.idx, c.viol, c.body = c.reqs[:0], c.idx[:0], c.viol[:0], c.body[:0]
	c.costBody = costBody{}
}

// collect sets c.reqs and c.idx to the requests of the charges that want picks, and returns
// the requests.
func (c *call) collect(want func(*charge) bool) []limit.Request {
	c.reqs, c.idx = c.reqs[:0], c.idx[:0]
	for i := range c.charges {
		if ch := &c.charges[i]; want(ch) {
			c.reqs, c.idx = append(c.reqs, ch.req), append(c.idx, i)
		}
	}
	return c.reqs
}

// every is the collect filter that picks every charge.
func every(*charge) bool { return true }

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
		if !ok {
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
			n, p := k.requestCost(r, c)
			if p != nil {
				return p, nil
			}
			ch.req.Cost = n
		}
	}
	k.splitConcurrency()
	if len(k.charges) == 0 {
		return nil, nil
	}
	return nil, g.decide(r.Context(), rs, k)
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

// ruling is what happens to a request and why: the verdict, the rule it defers to, the longest
// Retry-After of the rules it violated (which viol lists), and the policy the rate-limit
// headers report.
type ruling struct {
	action     verdict
	deferTo    *rule
	retryAfter time.Duration
	header     int // index in the charges of the policy the headers report; -1: none
	viol       []*rule
}

// decideRuling turns the decision of each charged rule into the ruling. It is pure: it reads
// its arguments and appends to viol only.
//   - The most restrictive rule decides: a violated rule that rejects makes it reject; else a
//     rule whose store failed and that fails closed makes it fail closed; else a violated
//     rule with on_limit: enqueue, or a matching action: enqueue rule, defers it (mayDefer
//     false — the job API itself — forwards instead); else it is forwarded.
//   - Shadow rules, rules that failed open and allowed requests never restrict.
//   - The headers report the policy closest to exhaustion (least remaining, then the longest
//     reset), among the violated rules on a 429; rules without a decision report nothing.
func decideRuling(charges []charge, matched []*rule, mayDefer bool, viol []*rule) ruling {
	rl := ruling{action: forward, header: -1, viol: viol}
	for i := range charges {
		ch := &charges[i]
		ru, d := ch.rule, &ch.dec
		switch src := ch.src; {
		case src == failedClosed:
			if rl.action != reject {
				rl.action = failClosed
			}
		case src == failedOpen || src == notCharged || d.Allowed || ru.shadow:
		case ru.onLimitEnqueue && mayDefer:
			if rl.deferTo == nil {
				rl.deferTo = ru
			}
		default:
			rl.action = reject
			rl.viol = append(rl.viol, ru)
			rl.retryAfter = max(rl.retryAfter, d.RetryAfter)
		}
	}
	if rl.action == forward {
		rl.deferTo = deferTarget(rl.deferTo, matched)
		if rl.deferTo != nil && mayDefer {
			rl.action = deferIt
		}
	}
	rl.header = headerPolicy(charges, rl.action == reject, mayDefer)
	return rl
}

// deferTarget is the rule a forwarded request defers to: the first violated on_limit: enqueue
// rule (first), else the first matching action: enqueue rule that is not in shadow mode.
func deferTarget(first *rule, matched []*rule) *rule {
	if first != nil {
		return first
	}
	for _, ru := range matched {
		if ru.actionEnqueue && !ru.shadow {
			return ru
		}
	}
	return nil
}

// headerPolicy returns the index of the charge whose policy the rate-limit headers report, or
// -1: the one closest to exhaustion among the rules that decided, and among the violated ones
// on a 429.
func headerPolicy(charges []charge, rejected, mayDefer bool) int {
	best := -1
	for i := range charges {
		ch := &charges[i]
		if ch.src == failedOpen || ch.src == failedClosed || ch.src == notCharged {
			continue
		}
		d, ru := &ch.dec, ch.rule
		if rejected && (d.Allowed || ru.shadow || ru.onLimitEnqueue && mayDefer) {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		b := &charges[best].dec
		if d.Remaining < b.Remaining || d.Remaining == b.Remaining && d.ResetAfter > b.ResetAfter {
			best = i
		}
	}
	return best
}

// countDecisions counts each rule's decision under the ruling rl in the decisions metric. The
// rule a request is deferred to is counted as enqueued once the job is stored (deferRequest).
func countDecisions(k *call, rl *ruling) {
	for i := range k.charges {
		ch := &k.charges[i]
		if o, ok := decisionOutcome(ch, rl); ok {
			ch.rule.counters[o].Inc()
		}
	}
	for _, ru := range k.matched {
		if ru.actionEnqueue && !ru.hasLimit && ru.shadow {
			ru.counters[OutcomeShadow].Inc()
		}
	}
}

// decisionOutcome is the outcome counted for charge ch; false when it is counted elsewhere.
func decisionOutcome(ch *charge, rl *ruling) (Outcome, bool) {
	ru, d, src := ch.rule, &ch.dec, ch.src
	deferred := rl.action == deferIt && ru == rl.deferTo
	switch {
	case src == notCharged:
		return 0, false
	case src == failedClosed && ru.shadow, src == failedOpen:
		return OutcomeFailOpen, true
	case src == failedClosed:
		return OutcomeFailClosed, true
	case !d.Allowed && ru.shadow:
		return OutcomeShadow, true
	case !d.Allowed && deferred, ru.actionEnqueue && deferred:
		return 0, false // counted as enqueued once it is
	case !d.Allowed:
		return OutcomeRejected, true
	case src == fromFallback:
		return OutcomeFailOpen, true
	}
	return OutcomeAllowed, true
}

// respond answers the request under the ruling: 429, 503, or 202 (the deferral), or reports
// true for a request that proceeds, with its headers.
func (g *gate) respond(c echo.Context, rs *ruleSet, k *call, rl *ruling, hdrs *rateHeaders) (bool, *rateHeaders, error) {
	w := c.Response()
	switch rl.action {
	case reject:
		if k.viol[0].conc != nil { // a rule that rejects stops the taking: they are all concurrency rules
			g.writeInFlightExceeded(w, k, hdrs)
		} else {
			g.writeQuotaExceeded(w, k, hdrs, retryAfterSeconds(rl.retryAfter))
		}
		return false, nil, nil
	case failClosed:
		if hdrs != nil {
			hdrs.apply(w.Header())
		}
		writeProblem(w, &Problem{
			Type:       "about:blank",
			Title:      "Rate limiter unavailable",
			Status:     http.StatusServiceUnavailable,
			Detail:     "the rate-limit store cannot be reached and a rule that applies to this request fails closed",
			RetryAfter: retryAfterSeconds(g.cooldown()),
		})
		return false, nil, nil
	case deferIt:
		if hdrs != nil {
			hdrs.apply(w.Header())
		}
		return false, nil, g.deferRequest(c, rs, rl.deferTo)
	}
	if g.noDefer == nil || !g.noDefer(c.Request().URL.Path) {
		if p := limitBody(c.Request(), k.matched, rs.queues); p != nil {
			if hdrs != nil {
				hdrs.apply(w.Header())
			}
			writeProblem(w, p)
			return false, nil, nil
		}
	}
	return true, hdrs, nil
}

// heldWhole is how much of a body net/http buffers before it must send the header: its
// bufferBeforeChunkingSize. A body up to this size, written before the handler returns, gets
// its Content-Length from net/http.
const heldWhole = 2048

// writeQuotaExceeded answers 429 for the rules in k.viol, with Retry-After and
// X-RateLimit-Retry-After of secs and the quota-exceeded problem. The body of a single rule's
// 429 is assembled from the parts compile made; it is the bytes writeProblem would write.
func (g *gate) writeQuotaExceeded(w http.ResponseWriter, k *call, hdrs *rateHeaders, secs int64) {
	if hdrs == nil { // cannot happen: a rule that rejects has its headers reported
		hdrs = &rateHeaders{vals: [6]string{5: itoa(secs)}}
	}
	h := w.Header()
	if hdrs.vals[0] != "" {
		hdrs.apply(h)
	}
	h[hdrXRetryAfter] = hdrs.vals[5:6:6]
	if len(k.viol) == 1 {
		ru := k.viol[0]
		b := append(k.body[:0], ru.quotaHead...)
		b = strconv.AppendInt(b, secs, 10)
		b = append(b, ru.quotaMid...)
		b = strconv.AppendInt(b, secs, 10)
		b = append(b, '}')
		k.body = b
	} else {
		names := make([]string, len(k.viol))
		for i, ru := range k.viol {
			names[i] = ru.name
		}
		k.body = (&Problem{
			Type:             QuotaExceededType,
			Title:            quotaTitle,
			Status:           http.StatusTooManyRequests,
			Detail:           quotaDetail(names, secs),
			ViolatedPolicies: names,
			RetryAfter:       secs,
		}).appendJSON(k.body[:0])
	}
	// No Content-Length for a body net/http holds whole until the handler returns, as here:
	// it writes the header itself then, without a map entry. That keeps the map at eight
	// entries, the most a map holds in one group; at nine, net/http's map and its copy of it
	// are hash tables, which cost this path several percent (BENCHMARKS.md).
	if len(k.body) > heldWhole {
		hdrs.prob[1] = itoa(int64(len(k.body)))
		h["Content-Length"] = hdrs.prob[1:2:2]
	} else {
		delete(h, "Content-Length")
	}
	setProblemHeaders(h, &hdrs.prob, http.StatusTooManyRequests, hdrs.vals[5])
	w.WriteHeader(http.StatusTooManyRequests)
	w.Write(k.body)
}

func (g *gate) cooldown() time.Duration {
	if g.breaker == nil {
		return time.Second
	}
	return g.breaker.cooldown
}

// quotaDetail is the detail of a 429 for the rules named violated, to be retried in secs.
func quotaDetail(violated []string, secs int64) string {
	if len(violated) == 1 {
		return fmt.Sprintf("rate limit %q exceeded; retry in %d s", violated[0], secs)
	}
	return fmt.Sprintf("rate limits %q exceeded; retry in %d s", violated, secs)
}

// decide fills in the decision and source of every charge of k. It returns an error only
// when ctx ended (the client went away); a failing store is handled here, rule by rule.
func (g *gate) decide(ctx context.Context, rs *ruleSet, k *call) error {
	start := time.Now()
	defer func() { g.metrics.duration.Observe(time.Since(start).Seconds()) }()

	if g.breaker == nil {
		decs, err := ask(ctx, g.limiter, k.collect(every), &k.one)
		if err == nil {
			k.settle(decs, fromStore)
			return nil
		}
		// An in-process limiter fails only on bad input, which compile rules out.
		g.log.Error("ingress: limiter", "err", err)
		g.metrics.storeErrors.Inc()
		k.failAll()
		return nil
	}

	if g.cachedRejection(k) {
		return nil
	}
	if ok, probe := g.breaker.allow(); ok {
		err := g.storeDecisions(ctx, rs.storeTimeout, k)
		if err == nil {
			g.breaker.done(probe, succeeded)
			g.rememberRejections(k)
			return nil
		}
		if ctx.Err() != nil {
			g.breaker.abandon(probe)
			return ctx.Err()
		}
		g.breaker.done(probe, classifyStoreError(err))
		g.metrics.storeErrors.Inc()
	}

	// The store failed or the breaker is open: rules that fail open are decided in-process.
	k.failAll()
	reqs := k.collect(func(ch *charge) bool { return ch.src == failedOpen })
	if len(reqs) == 0 {
		return nil
	}
	decs, err := ask(ctx, g.fallback, reqs, &k.one)
	if err != nil {
		g.log.Error("ingress: fallback limiter", "err", err)
		return nil // those rules stay failedOpen: allowed without a decision
	}
	k.settle(decs, fromFallback)
	return nil
}

// settle records decs, the limiter's answer to k.reqs, as the decisions of the charges in
// k.idx, decided from src.
func (k *call) settle(decs []limit.Decision, src source) {
	for j, i := range k.idx {
		ch := &k.charges[i]
		ch.dec, ch.src = decs[j], src
	}
}

// failAll marks every charge of k as left without a decision by the store.
func (k *call) failAll() {
	for i := range k.charges {
		ch := &k.charges[i]
		ch.dec, ch.src = limit.Decision{}, storeFailure(ch.rule)
	}
}

// ask decides reqs with lim: with Decide when there is one request (the common case, which
// needs no slice; its decision goes to one), else with DecideAll.
func ask(ctx context.Context, lim limit.Limiter, reqs []limit.Request, one *[1]limit.Decision) ([]limit.Decision, error) {
	if len(reqs) == 1 {
		q := &reqs[0]
		d, err := lim.Decide(ctx, q.Key, q.Limit, q.Cost)
		if err != nil {
			return nil, err
		}
		one[0] = d
		return one[:], nil
	}
	return lim.DecideAll(ctx, reqs)
}

// classifyStoreError tells a timeout (which a slow process sees too) from a hard failure of the
// store, for the breaker.
func classifyStoreError(err error) outcome {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return timedOut
	}
	return failedHard
}

// askStore asks the remote limiter for reqs under a context that ends after timeout. The
// limiter returns once that context ends (Options.Limiter), so this is the whole bound; the
// call runs on the request's goroutine, and nothing of it outlives the request.
func (g *gate) askStore(ctx context.Context, timeout time.Duration, k *call) ([]limit.Decision, error) {
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	decs, err := ask(tctx, g.limiter, k.reqs, &k.one)
	switch {
	case err != nil:
		return nil, fmt.Errorf("ingress: limiter store: %w", err)
	case len(decs) != len(k.reqs):
		return nil, fmt.Errorf("ingress: limiter store returned %d decisions for %d requests", len(decs), len(k.reqs))
	}
	return decs, nil
}

// storeFailure is what a rule without a decision does.
func storeFailure(ru *rule) source {
	if ru.failOpen || ru.shadow {
		return failedOpen
	}
	return failedClosed
}

// errNoEnqueuer is the answer to a deferral when no queue layer is configured.
var errNoEnqueuer = errors.New("ingress: no queue layer configured")
