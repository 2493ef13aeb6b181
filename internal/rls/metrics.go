package rls

import (
	"errors"
	"sync"
	"sync/atomic"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the service's collectors. decisions is the ingress's sluice_decisions_total
// when the Registerer holds it, so a rule is counted in one series whichever door it is
// asked through.
type metrics struct {
	decisions   *prometheus.CounterVec
	responses   *prometheus.CounterVec
	duration    prometheus.Histogram
	storeErrors prometheus.Counter
	abandoned   prometheus.Counter
	refunded    prometheus.Counter
	unrefunded  prometheus.Counter
	reloads     *prometheus.CounterVec

	// bound caches the decisions counters by rule label and outcome, so a call counts without
	// hashing and checking its labels (WithLabelValues) each time. Labels come from the
	// domain files and the config, so the map stays as small as they are; it is copied on
	// the rare write and read without a lock.
	bound   atomic.Pointer[map[labelPair]prometheus.Counter]
	boundMu sync.Mutex // serialises the copies
	// ok and over are sluice_rls_responses_total's two series, bound once.
	ok, over prometheus.Counter
}

type labelPair struct{ rule, outcome string }

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_decisions_total",
			Help: "Rate-limit decisions, by rule and outcome (allowed, rejected, shadow, fail_open, fail_closed, enqueued).",
		}, []string{"rule", "outcome"}),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_rls_responses_total",
			Help: "ShouldRateLimit answers of the Envoy rate-limit service, by overall code (OK, OVER_LIMIT).",
		}, []string{"code"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_rls_decision_duration_seconds",
			Help:    "Time to decide one ShouldRateLimit call, every descriptor, including the limiter store round trip.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_rls_store_errors_total",
			Help: "Limiter store calls of the rate-limit service that failed or timed out.",
		}),
		abandoned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_rls_abandoned_total",
			Help: "Limiter store calls of the rate-limit service that failed because their caller went away first (cancelled, or past its deadline): not store errors; no one reads the answer.",
		}),
		refunded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_rls_units_refunded_total",
			Help: "Units given back by is_negative_hits descriptors.",
		}),
		unrefunded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_rls_units_unrefunded_total",
			Help: "Units of is_negative_hits descriptors that found no recent charge of this process to give back (charged by another ingress, older than the limit's refund rules allow, or never charged).",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_rls_config_reloads_total",
			Help: "Reloads of the rate-limit service's domain files, by result (ok, error: the old domains stay).",
		}, []string{"result"}),
	}
	m.ok = m.responses.WithLabelValues(rlsv3.RateLimitResponse_OK.String())
	m.over = m.responses.WithLabelValues(rlsv3.RateLimitResponse_OVER_LIMIT.String())
	if reg == nil {
		return m, nil
	}
	if err := reg.Register(m.decisions); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, err
		}
		vec, ok := are.ExistingCollector.(*prometheus.CounterVec)
		if !ok {
			return nil, errors.New("rls: sluice_decisions_total is registered as another kind of collector")
		}
		m.decisions = vec
	}
	for _, c := range []prometheus.Collector{m.responses, m.duration, m.storeErrors, m.abandoned, m.refunded, m.unrefunded, m.reloads} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// count counts one decision of rule with outcome.
func (m *metrics) count(rule, outcome string) {
	k := labelPair{rule, outcome}
	if p := m.bound.Load(); p != nil {
		if c, ok := (*p)[k]; ok {
			c.Inc()
			return
		}
	}
	m.boundMu.Lock()
	defer m.boundMu.Unlock()
	old := m.bound.Load()
	next := make(map[labelPair]prometheus.Counter, 1)
	if old != nil {
		for k, c := range *old {
			next[k] = c
		}
	}
	c, ok := next[k]
	if !ok {
		c = m.decisions.WithLabelValues(rule, outcome)
		next[k] = c
	}
	m.bound.Store(&next)
	c.Inc()
}

// respond counts one answer by its overall code.
func (m *metrics) respond(over bool) {
	if over {
		m.over.Inc()
	} else {
		m.ok.Inc()
	}
}
