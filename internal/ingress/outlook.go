package ingress

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/queue"
)

// What the ingress knows of a queue's backlog and drain, read at most once a second per queue:
// the eta of an accepted or waiting job, and the admission of a fair queue's tenant up to its
// tenant_max_depth with the Retry-After of its refusal. No NATS round trip per accepted job.

// Drain is how a queue drains now, as far as the process can tell: what an eta divides by.
type Drain struct {
	// Rate is the deliveries per second the queue may make while not paused: an operator's
	// runtime rate, lowered to the rate the workers learned for an adaptive queue; 0: the
	// config file's rate.
	Rate float64
	// PausedUntil is when a pause in force ends (an operator's, or an upstream's Retry-After);
	// zero: not paused. Indefinite is an operator's pause without an end: then no eta can be
	// told.
	PausedUntil time.Time
	Indefinite  bool
}

const (
	// outlookTTL is how long one reading of a queue serves before the next request reads anew.
	outlookTTL = time.Second
	// outlookStale is how old a reading may be (reads failing meanwhile) and still refuse a
	// tenant's job; past it the tenant bound is not enforced (max_depth still is).
	outlookStale = 10 * time.Second
	// outlookTimeout bounds one reading.
	outlookTimeout = time.Second
)

// errNoDrain stands for the drain of a gate without Options.Drain: the config file's rate.
var errNoDrain = errors.New("ingress: no drain source")

// outlook is one queue's last reading, with, per tenant of a fair queue, the jobs this process
// accepted that the reading may not count. Its methods are safe for concurrent use.
type outlook struct {
	mu      sync.Mutex
	tried   time.Time // when the last reading was started
	at      time.Time // when the reading in use was started; zero: none yet
	reading bool      // a reading is under way
	backlog queue.Backlog
	drain   Drain
	// weights are the queue's weights by tenant id, derived under cfg; sumWeights is the sum
	// of the weights of backlog.Tenants.
	cfg        *config.Queue
	weights    map[string]float64
	sumWeights float64
	// Per tenant: jobs being published (inflight), and the backlog sequences of the jobs this
	// process stored that the reading in use does not count (stored: above its LastSeq).
	inflight map[string]int64
	stored   map[string][]uint64
	// extra are the tenants with jobs accepted since the reading that it does not list, and
	// extraWeights the sum of their weights: share counts them among the active tenants.
	extra        map[string]struct{}
	extraWeights float64
}

// outlook returns the outlook of queue q.
func (g *gate) outlook(q *config.Queue) *outlook {
	if v, ok := g.outlooks.Load(q.Name); ok {
		return v.(*outlook)
	}
	v, _ := g.outlooks.LoadOrStore(q.Name, &outlook{})
	return v.(*outlook)
}

// refresh reads queue q anew when its last reading is a second old, in the calling request:
// at most one reading per queue at once, and one a second.
func (o *outlook) refresh(ctx context.Context, g *gate, q *config.Queue) {
	now := g.now()
	o.mu.Lock()
	if o.reading || (!o.tried.IsZero() && now.Sub(o.tried) < outlookTTL && !now.Before(o.tried)) {
		o.mu.Unlock()
		return
	}
	o.reading, o.tried = true, now
	o.mu.Unlock()

	rctx, cancel := context.WithTimeout(ctx, outlookTimeout)
	defer cancel()
	b, err := g.enqueuer.Backlog(rctx, q.Name)
	var d Drain
	derr := errNoDrain
	if err == nil && g.drain != nil {
		d, derr = g.drain(rctx, q.Name)
	}
	weights := o.weightsFor(g, q)

	o.mu.Lock()
	defer o.mu.Unlock()
	o.reading = false
	if err != nil {
		g.log.Debug("ingress: read the queue's backlog", "queue", q.Name, "err", err)
		if o.at.IsZero() || now.Sub(o.at) >= outlookStale {
			// Reads keep failing: the bound is not enforced (admit), and the jobs stored
			// meanwhile are forgotten rather than kept in memory without end.
			o.stored = nil
		}
		return
	}
	switch {
	case derr == nil:
		o.drain = d
	case g.drain != nil:
		g.log.Debug("ingress: read how the queue drains", "queue", q.Name, "err", derr) // the last reading's stays
	}
	o.install(now, b, q, weights)
}

// install makes b, read from at, the reading of q in use, with q's weights by tenant id: it
// forgets the jobs stored that b counts, and sums the weights of the tenants with jobs
// waiting. o.mu is held.
func (o *outlook) install(at time.Time, b queue.Backlog, q *config.Queue, weights map[string]float64) {
	o.at, o.backlog = at, b
	for t, seqs := range o.stored {
		kept := seqs[:0]
		for _, s := range seqs {
			if s > b.LastSeq {
				kept = append(kept, s)
			}
		}
		if len(kept) == 0 {
			delete(o.stored, t)
		} else {
			o.stored[t] = kept
		}
	}
	o.cfg, o.weights, o.sumWeights = q, weights, 0
	for t := range b.Tenants {
		o.sumWeights += weightOf(weights, t)
	}
	o.extra, o.extraWeights = nil, 0
	for t := range o.stored {
		o.active(t)
	}
	for t := range o.inflight {
		o.active(t)
	}
}

// weightsFor is q's weights by tenant id: the ones o has when they were derived under q, else
// derived anew (nil when ids cannot be derived yet).
func (o *outlook) weightsFor(g *gate, q *config.Queue) map[string]float64 {
	o.mu.Lock()
	cfg, w := o.cfg, o.weights
	o.mu.Unlock()
	if cfg == q || len(q.Weights) == 0 {
		return w
	}
	out := make(map[string]float64, len(q.Weights))
	for v, wt := range q.Weights {
		id, err := g.enqueuer.TenantID([]byte(v))
		if err != nil {
			return nil
		}
		out[id] = wt
	}
	return out
}

func weightOf(weights map[string]float64, tenant string) float64 {
	if w, ok := weights[tenant]; ok {
		return w
	}
	return 1
}

// admit decides whether tenant may add a job to fair queue q now, and if so counts the job as
// being published until settle. A job of a queue that is not fair or without tenant_max_depth
// is admitted; so is one when the last reading is older than outlookStale (reads failing).
// Before the first reading lands, the jobs this process is storing and stored still count. A
// refusal is a *tenantFullError.
func (o *outlook) admit(now time.Time, q *config.Queue, tenant string) error {
	if !q.Fair {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if q.TenantMaxDepth > 0 && (o.at.IsZero() || now.Sub(o.at) < outlookStale) {
		if n := o.depth(tenant); n >= q.TenantMaxDepth {
			return &tenantFullError{queue: q.Name, maxDepth: q.TenantMaxDepth,
				retryAfter: o.tenantRetryAfter(now, q, tenant, n)}
		}
	}
	o.inflight = inc(o.inflight, tenant, 1)
	o.active(tenant)
	return nil
}

// settle ends the publish of a job admitted for tenant of fair queue q: stored at backlog
// sequence seq, or not (seq 0).
func (o *outlook) settle(q *config.Queue, tenant string, seq uint64) {
	if !q.Fair {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.inflight = inc(o.inflight, tenant, -1)
	if seq > o.backlog.LastSeq { // else the reading in use counts it
		if o.stored == nil {
			o.stored = map[string][]uint64{}
		}
		o.stored[tenant] = append(o.stored[tenant], seq)
	}
}

// inc adds d to m[k], deleting the entry at 0; it makes m when it is nil.
func inc(m map[string]int64, k string, d int64) map[string]int64 {
	if m == nil {
		m = map[string]int64{}
	}
	if m[k] += d; m[k] <= 0 {
		delete(m, k)
	}
	return m
}

// active counts tenant among the tenants with jobs waiting, for share, when the reading does
// not list it.
func (o *outlook) active(tenant string) {
	if _, ok := o.backlog.Tenants[tenant]; ok {
		return
	}
	if _, ok := o.extra[tenant]; ok {
		return
	}
	if o.extra == nil {
		o.extra = map[string]struct{}{}
	}
	o.extra[tenant] = struct{}{}
	o.extraWeights += weightOf(o.weights, tenant)
}

// depth is how many jobs tenant holds in its backlog, as far as o can tell: the reading's,
// plus the jobs this process stored after it or is storing. Jobs moved on since the reading are
// not subtracted (it errs high by what the tenant's share moved in under a second), and jobs
// other processes stored since are not seen until the next reading.
func (o *outlook) depth(tenant string) int64 {
	return int64(min(o.backlog.Tenants[tenant], math.MaxInt64/4)) + int64(len(o.stored[tenant])) + o.inflight[tenant]
}

// rate is the deliveries per second of q while not paused.
func (o *outlook) rate(q *config.Queue) float64 {
	if o.drain.Rate > 0 {
		return o.drain.Rate
	}
	return q.Rate.PerSecond()
}

// share is the deliveries per second tenant of fair queue q gets while it has jobs waiting:
// the queue's rate times its weight over the weights of every tenant with jobs waiting, it
// included (weighted round robin), capped by tenant_rate.
func (o *outlook) share(q *config.Queue, tenant string) float64 {
	w := weightOf(o.weights, tenant)
	sum := o.sumWeights + o.extraWeights
	_, listed := o.backlog.Tenants[tenant]
	if _, extra := o.extra[tenant]; !listed && !extra {
		sum += w
	}
	s := o.rate(q) * w / max(sum, w)
	if c := q.TenantRate.PerSecond(); c > 0 && s > c {
		s = c
	}
	return s
}

// tenantRetryAfter is the Retry-After, in whole seconds, of refusing a job of tenant of q, which
// holds n jobs: the time its share of the rate needs to move the jobs beyond its bound (n -
// tenant_max_depth + 1, the job refused included), plus what remains of a pause.
func (o *outlook) tenantRetryAfter(now time.Time, q *config.Queue, tenant string, n int64) int64 {
	secs := float64(n-q.TenantMaxDepth+1) / o.share(q, tenant)
	if p := o.drain.PausedUntil; p.After(now) {
		secs += p.Sub(now).Seconds()
	}
	return wholeSeconds(secs)
}

// waitFor is the Retry-After, in whole seconds, of a refusal by the admission ledger (a tenant
// at its tenant_max_depth, a key at its max_waiting_per_key): the time n jobs take at tenant's
// share of q's rate (tenant "": the queue's rate), plus what remains of a pause.
func (o *outlook) waitFor(now time.Time, q *config.Queue, tenant string, n int64) int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	r := o.rate(q)
	if tenant != "" && q.Fair {
		r = o.share(q, tenant)
	}
	secs := float64(n) / r
	if p := o.drain.PausedUntil; p.After(now) {
		secs += p.Sub(now).Seconds()
	}
	return wholeSeconds(secs)
}

// wholeSeconds is secs rounded up, at least 1 and at most 2^31-1.
func wholeSeconds(secs float64) int64 {
	if !(secs < math.MaxInt32) { // also NaN
		return math.MaxInt32
	}
	return max(int64(math.Ceil(secs)), 1)
}

// when is the estimated delivery of a job with ahead jobs before it, avail of which were in
// the queue (or the tenant's backlog) at the reading, draining at r a second: those avail go
// from the reading's time (or the end of a pause), the others no sooner than now. false when
// there is no estimate: no recent reading, an operator's pause without end, no rate.
func (o *outlook) when(now time.Time, ahead, avail, r float64) (time.Time, bool) {
	if o.at.IsZero() || now.Sub(o.at) >= outlookStale || o.drain.Indefinite || !(r > 0) {
		return time.Time{}, false
	}
	start, from := o.at, now
	if p := o.drain.PausedUntil; p.After(start) {
		start = p
	}
	if p := o.drain.PausedUntil; p.After(from) {
		from = p
	}
	t := start.Add(seconds(ahead / r))
	if t2 := from.Add(seconds(max(ahead-avail, 0) / r)); t2.After(t) {
		t = t2
	}
	return t, true
}

// seconds is s seconds as a duration, at most about 290 years.
func seconds(s float64) time.Duration {
	if !(s < float64(math.MaxInt64/int64(time.Second))) {
		return math.MaxInt64
	}
	return time.Duration(s * float64(time.Second))
}

// buffered is the time the jobs already in q's delivery stream take at q's rate: how long a
// job moved there from a tenant's backlog waits behind them.
func (o *outlook) buffered(q *config.Queue) time.Duration {
	return seconds(float64(o.backlog.Pending+uint64(max(o.backlog.InFlight, 0))) / o.rate(q))
}

// etaStored is the eta of a job just stored in q for tenant (rcpt its receipt): in a plain
// queue from its sequence against the reading's ack floor; in a fair queue from its tenant's
// backlog (it last) and share, then the delivery stream's jobs.
func (o *outlook) etaStored(now time.Time, q *config.Queue, tenant string, rcpt queue.Receipt) (time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !q.Fair {
		return o.etaSeq(now, q, rcpt.Seq)
	}
	ahead := float64(max(o.depth(tenant)-1, 0))
	t, ok := o.when(now, ahead, float64(o.backlog.Tenants[tenant]), o.share(q, tenant))
	return t.Add(o.buffered(q)), ok
}

// etaSeq is the eta of the job at seq in q's delivery stream; o.mu held.
func (o *outlook) etaSeq(now time.Time, q *config.Queue, seq uint64) (time.Time, bool) {
	var ahead uint64
	if seq > o.backlog.AckFloor+1 {
		ahead = seq - o.backlog.AckFloor - 1
	}
	avail := o.backlog.Pending + uint64(max(o.backlog.InFlight, 0))
	return o.when(now, float64(ahead), float64(avail), o.rate(q))
}

// etaPlace is the eta of a waiting job of tenant of q at p: in the delivery stream as
// etaStored; in its tenant's backlog, its share of the tenant's waiting jobs by sequence (its
// tenant's jobs leave in order).
func (o *outlook) etaPlace(now time.Time, q *config.Queue, tenant string, p queue.Place) (time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if p.Seq != 0 {
		return o.etaSeq(now, q, p.Seq)
	}
	var ahead float64
	if d := o.backlog.Tenants[tenant]; d > 1 && p.TenantLast > p.TenantFirst {
		ahead = float64(d-1) * float64(p.BacklogSeq-p.TenantFirst) / float64(p.TenantLast-p.TenantFirst)
	}
	t, ok := o.when(now, ahead, 0, o.share(q, tenant))
	return t.Add(o.buffered(q)), ok
}
