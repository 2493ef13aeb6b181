package ingress

import (
	"errors"
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/limit"
)

// Outcome is what one rule decided for one request, as the outcome label of
// sluice_decisions_total reports it.
type Outcome int

// The outcomes.
const (
	// OutcomeAllowed: within the limit (or no limit: an action: enqueue rule counts its
	// requests as enqueued instead).
	OutcomeAllowed Outcome = iota
	// OutcomeRejected: over the limit, answered 429.
	OutcomeRejected
	// OutcomeShadow: over the limit of a rule in shadow mode; let through.
	OutcomeShadow
	// OutcomeFailOpen: the limiter store failed and the rule fails open; decided by the
	// in-process fallback limiter, and allowed.
	OutcomeFailOpen
	// OutcomeFailClosed: the limiter store failed and the rule fails closed; answered 503.
	OutcomeFailClosed
	// OutcomeEnqueued: deferred to the rule's queue.
	OutcomeEnqueued
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"allowed", "rejected", "shadow", "fail_open", "fail_closed", "enqueued"}

// String returns the label value: "allowed", "rejected", "shadow", "fail_open", "fail_closed"
// or "enqueued".
func (o Outcome) String() string { return outcomeNames[o] }

// metrics are the ingress's Prometheus collectors.
type metrics struct {
	decisions      *prometheus.CounterVec
	duration       prometheus.Histogram
	storeErrors    prometheus.Counter
	breakerState   prometheus.Gauge
	requests       *prometheus.CounterVec
	upstreamErrors prometheus.Counter
	bodyErrors     *prometheus.CounterVec
	cachedRejects  prometheus.Counter
	leased         prometheus.Counter
	overflows      prometheus.CounterFunc
	reconciled     *prometheus.CounterVec
	unreconciled   *prometheus.CounterVec
	debtCapped     *prometheus.CounterVec
	budgetRefunds  *prometheus.CounterVec // units given back to budgets a sibling refused (budgets.go)
	owed           prometheus.Gauge       // extra charges kept after the store failed them (owed.go)
	owedCharges    *prometheus.CounterVec // those charges by what became of them
	streamsCut     *prometheus.CounterVec
	readAheadBytes prometheus.GaugeFunc
	readAheadSkips prometheus.Counter
	readAhead      readAhead                       // the bytes held by cost read-ahead, across requests
	memories       atomic.Pointer[[]*limit.Memory] // the in-memory stores the gate decides with

	byCode [600]atomic.Pointer[counter] // children of requests, by status code
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_decisions_total",
			Help: "Rate-limit decisions, by rule and outcome (allowed, rejected, shadow, fail_open, fail_closed, enqueued).",
		}, []string{"rule", "outcome"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_decision_duration_seconds",
			Help:    "Time to decide one request against all the rules it matches, including the limiter store round trip.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}),
		reconciled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_rule_units_reconciled_total",
			Help: "Units charged (direction charge) or refunded (direction refund) to rules' keys once the upstream's answer said what a request really cost (cost_from_response).",
		}, []string{"rule", "direction"}),
		unreconciled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_rule_cost_unreconciled_total",
			Help: "Forwarded requests of rules with cost_from_response whose true cost could not be read from the answer or charged, so the estimate stands.",
		}, []string{"rule"}),
		debtCapped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_rule_debt_capped_total",
			Help: "Extra charges of cost_from_response that would have put a key more than limit.DebtCapacities capacities in debt: the rest was dropped.",
		}, []string{"rule"}),
		budgetRefunds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_budget_refunds_total",
			Help: "Units given back to a rule's budgets that admitted a request another budget of the same rule refused (budgets:), by budget (<rule>/<budget>); result failed counts refunds the store could not make.",
		}, []string{"rule", "result"}),
		owed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_rule_owed_charges",
			Help: "Extra charges of cost_from_response that the store failed and that are kept to be charged again (at most 4096).",
		}),
		owedCharges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_rule_owed_charges_total",
			Help: "Extra charges of cost_from_response that the store failed, by result: kept (to charge again), paid (charged later), made (found made already: the failed call had run after all, so not charged again), dropped (the bound was full, or a reload changed the limit so that the charge no longer fits it).",
		}, []string{"result"}),
		streamsCut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_rule_streams_cut_total",
			Help: "Streamed answers of rules with cost_from_response cut short (the client gone, the upstream reset, the rule's timeout), by what they were charged (cost_on_cut: estimate or deltas), or ended by cut_on_debt (debt).",
		}, []string{"rule", "charged"}),
		readAheadSkips: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_cost_read_ahead_skipped_total",
			Help: "Requests charged their rule's cost fallback without reading the body because the read-ahead bound (read_ahead_bytes) was held by others, or the read-ahead deadline passed.",
		}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_store_errors_total",
			Help: "Limiter store calls that failed or timed out.",
		}),
		breakerState: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_breaker_state",
			Help: "State of the circuit breaker in front of the limiter store: 0 closed, 1 half-open, 2 open.",
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_requests_total",
			Help: "Requests answered by the ingress, by status code.",
		}, []string{"code"}),
		upstreamErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_upstream_errors_total",
			Help: "Forwarded requests that got no response from the upstream (502 and 504).",
		}),
	}
	m.overflows = prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "sluice_limiter_overflow_total",
		Help: "Decisions of new keys on their rule's shared overflow limit because the in-memory limiter was full of keys whose limits still apply.",
	}, func() float64 {
		var n uint64
		if ms := m.memories.Load(); ms != nil {
			for _, mem := range *ms {
				n += mem.Overflows()
			}
		}
		return float64(n)
	})
	m.readAheadBytes = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_cost_read_ahead_bytes",
		Help: "Bytes of request bodies held by cost read-ahead now, across requests (at most read_ahead_bytes).",
	}, func() float64 { return float64(m.readAhead.held.Load()) })
	m.cachedRejects = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_cached_rejections_total",
		Help: "Requests rejected from the ingress's cache of the store's rejections, without asking the store.",
	})
	m.leased = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_leased_decisions_total",
		Help: "Requests admitted from a rule's lease (requests taken from the store ahead), without asking the store.",
	})
	m.bodyErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_request_body_errors_total",
		Help: "Requests whose body could not be read, by reason: timeout (cut off after read_timeout, 408) or malformed (400).",
	}, []string{"reason"})
	if reg != nil {
		for _, c := range []prometheus.Collector{m.decisions, m.duration, m.storeErrors, m.breakerState, m.requests, m.upstreamErrors, m.bodyErrors, m.overflows, m.cachedRejects, m.leased, m.reconciled, m.unreconciled, m.debtCapped, m.budgetRefunds, m.owed, m.owedCharges, m.streamsCut, m.readAheadBytes, m.readAheadSkips} {
			if err := reg.Register(c); err != nil {
				var are prometheus.AlreadyRegisteredError
				if errors.As(err, &are) {
					return nil, errors.New("ingress: metrics already registered: use one Registerer per Server")
				}
				return nil, err
			}
		}
	}
	return m, nil
}

// countBodyProblem counts a request whose body could not be read.
func (m *metrics) countBodyProblem(p *Problem) {
	reason := "malformed"
	if p == errBodyTimeout {
		reason = "timeout"
	}
	m.bodyErrors.WithLabelValues(reason).Inc()
}

// countRequest counts a response with status code. The counter of each code is looked up
// once and kept, so that counting takes no label hashing or lock.
func (m *metrics) countRequest(code int) {
	if code < 0 || code >= len(m.byCode) {
		m.requests.WithLabelValues(strconv.Itoa(code)).Inc()
		return
	}
	c := m.byCode[code].Load()
	if c == nil {
		c = &counter{m.requests.WithLabelValues(smallInts[code])}
		m.byCode[code].Store(c) // a racing store keeps an equal value: the same child counter
	}
	c.Inc()
}

// counter boxes a prometheus.Counter for an atomic.Pointer.
type counter struct{ prometheus.Counter }
