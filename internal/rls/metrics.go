package rls

import (
	"errors"

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
	refunded    prometheus.Counter
	unrefunded  prometheus.Counter
	reloads     *prometheus.CounterVec
}

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
	for _, c := range []prometheus.Collector{m.responses, m.duration, m.storeErrors, m.refunded, m.unrefunded, m.reloads} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) count(rule, outcome string) { m.decisions.WithLabelValues(rule, outcome).Inc() }
