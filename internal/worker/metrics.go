package worker

import (
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the worker's Prometheus collectors. Every method is safe for concurrent use.
type metrics struct {
	deliveries  *prometheus.CounterVec   // queue, outcome
	latency     *prometheus.HistogramVec // queue
	slotWait    *prometheus.HistogramVec // queue
	slotLate    *prometheus.HistogramVec // queue
	pauses      *prometheus.CounterVec   // queue
	deadLetters *prometheus.CounterVec   // queue, reason
	takeErrors  *prometheus.CounterVec   // queue
	placeWait   *prometheus.HistogramVec // queue
	placeErrors *prometheus.CounterVec   // queue
	givenUp     *prometheus.CounterVec   // queue
	handedBack  *prometheus.CounterVec   // queue
	skipped     *prometheus.CounterVec   // queue
	inFlight    *prometheus.GaugeVec     // queue
	// unit budgets (cost.go)
	unitsDelivered  *prometheus.CounterVec // queue
	unitsReconciled *prometheus.CounterVec // queue, direction
	unreconciled    *prometheus.CounterVec // queue
	debtCapped      *prometheus.CounterVec // queue
	owed            *prometheus.GaugeVec   // queue (owed.go)
	owedCharges     *prometheus.CounterVec // queue, result
	drain           *drainRate
	// a global queue's regional lease (regions.go)
	regionShare   *prometheus.GaugeVec   // queue
	regionExpiry  *prometheus.GaugeVec   // queue
	regionOnSafe  *prometheus.GaugeVec   // queue
	regionLost    *prometheus.GaugeVec   // queue
	regionFailure *prometheus.CounterVec // queue
	// answers are the Answers the presence entry carries (answers.go)
	answers answers
}

// fallbacks, when not nil, reads the queue layer's count of ticket releases by acknowledgement
// that fell back to deletion (queue.Deliveries.ReleaseFallbacks).
func newMetrics(reg prometheus.Registerer, fallbacks func() uint64) (*metrics, error) {
	m := &metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_deliveries_total",
			Help: "Delivery attempts to the upstream by queue and outcome: success (2xx), retry (5xx, timeout, connection error), pause (429/503), permanent (other 4xx and unusable jobs).",
		}, []string{"queue", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_delivery_duration_seconds",
			Help:    "Time from sending a job to the upstream until its response was read, by queue.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
		}, []string{"queue"}),
		slotLate: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_slot_lateness_seconds",
			Help:    "How late after its leak slot a delivery left, by queue (slots later than the tolerance are given up, not counted here).",
			Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05},
		}, []string{"queue"}),
		slotWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_slot_wait_seconds",
			Help:    "Time a job in hand waited for its leak slot (pauses and store outages included), by queue.",
			Buckets: prometheus.ExponentialBuckets(0.001, 3, 12),
		}, []string{"queue"}),
		pauses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_queue_pauses_total",
			Help: "Times a worker paused a queue for all workers after an upstream 429 or 503.",
		}, []string{"queue"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_dead_letters_total",
			Help: "Jobs moved to the dead-letter stream, by queue and reason: max_attempts, permanent, max_pause_retries.",
		}, []string{"queue", "reason"}),
		givenUp: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_worker_slots_given_up_total",
			Help: "Leak slots given up because the worker woke too late to use them on time (a stall), by queue.",
		}, []string{"queue"}),
		takeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_slot_take_errors_total",
			Help: "Failed attempts to take a leak slot (the leak schedule's store unreachable); no job is delivered without a slot.",
		}, []string{"queue"}),
		placeWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_place_wait_seconds",
			Help:    "Time a job in hand waited for its concurrency places (max_in_flight, tenant_in_flight), by queue.",
			Buckets: prometheus.ExponentialBuckets(0.001, 3, 12),
		}, []string{"queue"}),
		placeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_place_errors_total",
			Help: "Failed attempts to take a concurrency place (its store unreachable); no job is delivered without its places.",
		}, []string{"queue"}),
		handedBack: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_jobs_handed_back_total",
			Help: "Jobs returned undelivered for immediate redelivery (shutdown, queue removed by reload).",
		}, []string{"queue"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_redeliveries_skipped_total",
			Help: "Redelivered jobs acknowledged without delivery because their status was already final.",
		}, []string{"queue"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_worker_jobs_held",
			Help: "Jobs this process holds, waiting for a slot or being delivered, by queue.",
		}, []string{"queue"}),
		unitsDelivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_units_delivered_total",
			Help: "Units (cost_rate's) of the jobs delivered, by queue: the true cost where the answer said it (cost_from_response), else the charged estimate.",
		}, []string{"queue"}),
		unitsReconciled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_units_reconciled_total",
			Help: "Units charged (true cost above the estimate) or refunded (below) on a queue's unit schedule once the answer said the true cost, by queue and direction.",
		}, []string{"queue", "direction"}),
		debtCapped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_queue_debt_capped_total",
			Help: "Answers of a queue whose true cost was more than limit.DebtCapacities of the queue's unit capacities above the estimate: the rest was dropped. By queue.",
		}, []string{"queue"}),
		unreconciled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_cost_unreconciled_total",
			Help: "Answers of a queue with cost_from_response that carried no usable true cost (missing, malformed) or whose reconciliation failed; the estimate stood. By queue.",
		}, []string{"queue"}),
		owed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_queue_owed_charges",
			Help: "Extra unit charges (true cost above the estimate) the queue's unit schedule failed, kept by this process to be made again, by queue.",
		}, []string{"queue"}),
		owedCharges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_queue_owed_charges_total",
			Help: "Extra unit charges the queue's unit schedule failed, by queue and result: kept (to be made again), paid (made after a later delivery), dropped (over the bound of 4096 kept).",
		}, []string{"queue", "result"}),
		drain: newDrainRate(time.Now),
		regionShare: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_region_share",
			Help: "Deliveries per second this worker's region may use of a global queue's rate now: its lease's share (a lowered share's former value while the coordinator still counts it), or its safe share once the lease expired unrenewed. By queue.",
		}, []string{"queue"}),
		regionExpiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_region_lease_expiry_timestamp_seconds",
			Help: "When the region's lease of a global queue's rate, as this worker last renewed it, expires (Unix seconds). By queue.",
		}, []string{"queue"}),
		regionOnSafe: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_region_on_safe_share",
			Help: "1 while this worker's region runs on its safe share of a global queue (no lease yet, or its lease expired unrenewed: the coordinator is out of reach), else 0. sluice_region_lease_lost is the alert. By queue.",
		}, []string{"queue"}),
		regionLost: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_region_lease_lost",
			Help: "1 while this worker's region has held no lease of a global queue's rate (it runs on its safe share) for longer than a lease and a renew period, else 0: the alert. By queue.",
		}, []string{"queue"}),
		regionFailure: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_region_renewal_failures_total",
			Help: "Renewals of the region's lease of a global queue that failed (coordinator unreachable, or too many concurrent renewals). By queue.",
		}, []string{"queue"}),
	}
	if reg == nil {
		return m, nil
	}
	if fallbacks != nil {
		f := prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_ticket_release_fallbacks_total",
			Help: "Admission tickets of acknowledged jobs released by deletion because their ledger's hold consumer did not answer the release's acknowledgement within 2s (the ticket not delivered to it: no process subscribed to its deliveries, the consumer missing). Each costs nats-server a JetStream API request; steadily rising means the cheap release is not working.",
		}, func() float64 { return float64(fallbacks()) })
		if err := reg.Register(f); err != nil {
			return nil, errors.Join(errors.New("worker: register metrics"), err)
		}
	}
	for _, c := range []prometheus.Collector{m.deliveries, m.latency, m.slotWait, m.slotLate, m.pauses,
		m.deadLetters, m.takeErrors, m.placeWait, m.placeErrors, m.givenUp, m.handedBack, m.skipped, m.inFlight, m.drain,
		m.unitsDelivered, m.unitsReconciled, m.unreconciled, m.debtCapped, m.owed, m.owedCharges, m.regionShare, m.regionExpiry, m.regionOnSafe,
		m.regionLost, m.regionFailure} {
		if err := reg.Register(c); err != nil {
			return nil, errors.Join(errors.New("worker: register metrics"), err)
		}
	}
	return m, nil
}

// drainRate is the sluice_drain_rate gauge: delivery attempts per second over the last
// drainWindow, per queue, counted in one-second buckets. Summed over all worker processes it
// is the queue's achieved leak rate.
type drainRate struct {
	now  func() time.Time
	desc *prometheus.Desc
	mu   sync.Mutex
	q    map[string]*ring
}

// ring counts events in the last len(buckets) whole seconds.
type ring struct {
	buckets [10]int64
	sec     int64 // the Unix second of the newest bucket
}

func newDrainRate(now func() time.Time) *drainRate {
	return &drainRate{
		now: now,
		desc: prometheus.NewDesc("sluice_drain_rate",
			"Delivery attempts per second to the upstream from this process over the last 10s, by queue; the sum over all workers is the achieved leak rate.",
			[]string{"queue"}, nil),
		q: map[string]*ring{},
	}
}

func (r *ring) advance(sec int64) {
	if sec <= r.sec {
		return
	}
	n := sec - r.sec
	if n >= int64(len(r.buckets)) {
		r.buckets = [10]int64{}
	} else {
		for i := r.sec + 1; i <= sec; i++ {
			r.buckets[i%int64(len(r.buckets))] = 0
		}
	}
	r.sec = sec
}

// add counts one delivery of queue now.
func (d *drainRate) add(queue string) {
	sec := d.now().Unix()
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.q[queue]
	if r == nil {
		r = &ring{sec: sec}
		d.q[queue] = r
	}
	r.advance(sec)
	r.buckets[sec%int64(len(r.buckets))]++
}

// rate is the per-second rate of queue over the window ending now. The current, partial
// second is counted with the nine before it.
func (d *drainRate) rate(queue string) float64 {
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.q[queue]
	if r == nil {
		return 0
	}
	r.advance(now.Unix())
	var n int64
	for _, b := range r.buckets {
		n += b
	}
	// The window is 9 whole seconds plus the elapsed part of the current one.
	span := 9 + float64(now.Nanosecond())/1e9
	return float64(n) / span
}

func (d *drainRate) forget(queue string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.q, queue)
}

// Describe implements prometheus.Collector.
func (d *drainRate) Describe(ch chan<- *prometheus.Desc) { ch <- d.desc }

// Collect implements prometheus.Collector.
func (d *drainRate) Collect(ch chan<- prometheus.Metric) {
	d.mu.Lock()
	names := make([]string, 0, len(d.q))
	for name := range d.q {
		names = append(names, name)
	}
	d.mu.Unlock()
	for _, name := range names {
		ch <- prometheus.MustNewConstMetric(d.desc, prometheus.GaugeValue, d.rate(name), name)
	}
}
