package admin

import (
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Drain is what DesiredWorkers needs to know of a queue now.
type Drain struct {
	// Workers is how many worker processes drain the queue now.
	Workers int
	// Depth is the jobs in the queue, waiting and in flight.
	Depth uint64
	// Delivered is the jobs per second that all Workers together delivered lately (the last
	// minute); Allowed the effective rate now, 0 while Paused.
	Delivered, Allowed float64
	Paused             bool
	// MaxInFlight is the queue's max_in_flight (0: none) and Concurrency a worker's
	// deliveries at once: more than MaxInFlight/Concurrency workers can never all deliver.
	MaxInFlight int64
	Concurrency int
}

// maxDesiredWorkers bounds DesiredWorkers.
const maxDesiredWorkers = 1000

// metFraction: a queue that delivers at least this share of its effective rate has the
// workers it can use; more would wait on the rate, not drain faster.
const metFraction = 0.9

// DesiredWorkers is how many worker processes the drain of a queue can use now: what its
// effective rate needs at the per-worker delivery rate measured (Delivered / Workers), capped by
// MaxInFlight / Concurrency. It never scales on the backlog's size: a backlog the current
// workers drain at the effective rate keeps the count that rate needs. While the queue is
// paused, or delivers its effective rate already, it stays at Workers; with nothing waiting it
// is what the deliveries of late need (0 when there were none); with jobs waiting and no worker
// it is 1, to measure.
func DesiredWorkers(d Drain) int {
	capped := func(n int) int {
		if d.MaxInFlight > 0 && d.Concurrency > 0 {
			n = min(n, int((d.MaxInFlight+int64(d.Concurrency)-1)/int64(d.Concurrency)))
		}
		return max(0, min(n, maxDesiredWorkers))
	}
	switch {
	case d.Paused || d.Allowed <= 0:
		return d.Workers
	case d.Workers <= 0:
		if d.Depth > 0 {
			return 1
		}
		return 0
	case d.Delivered <= 0:
		if d.Depth > 0 {
			return d.Workers // held up by something workers do not fix (a stuck upstream)
		}
		return 0
	}
	perWorker := d.Delivered / float64(d.Workers)
	if d.Depth == 0 {
		return capped(int(math.Ceil(d.Delivered/perWorker - 1e-9)))
	}
	if d.Delivered >= metFraction*d.Allowed {
		return capped(d.Workers)
	}
	return capped(max(d.Workers, int(math.Ceil(d.Allowed/perWorker-1e-9))))
}

var descDesired = prometheus.NewDesc("sluice_queue_desired_workers",
	"Worker processes the queue's drain can use now: its effective rate over the measured per-worker delivery rate, capped by max_in_flight / concurrency; not raised while paused or already at its rate. For autoscalers (KEDA).",
	[]string{"queue"}, nil)

// DesiredMetric returns the collector of sluice_queue_desired_workers{queue}, from the history's
// last minute and workers, the worker processes draining each queue now (false when unknown:
// then nothing is exported).
func (h *History) DesiredMetric(workers func() (map[string]int, bool)) prometheus.Collector {
	return &desiredMetric{h: h, workers: workers}
}

type desiredMetric struct {
	h       *History
	workers func() (map[string]int, bool)
}

func (m *desiredMetric) Describe(ch chan<- *prometheus.Desc) { ch <- descDesired }

func (m *desiredMetric) Collect(ch chan<- prometheus.Metric) {
	ws, ok := m.workers()
	if !ok {
		return
	}
	for name, d := range m.h.Drains(time.Minute) {
		d.Workers = ws[name]
		ch <- prometheus.MustNewConstMetric(descDesired, prometheus.GaugeValue, float64(DesiredWorkers(d)), name)
	}
}

// Drains returns, per sampled queue, its last sample and its mean delivery rate over the
// samples of the last window, with its config's max_in_flight and concurrency; Workers is 0.
func (h *History) Drains(window time.Duration) map[string]Drain {
	cfg := h.Queues.Config()
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]Drain, len(h.rings))
	for _, cq := range cfg.Queues {
		r := h.rings[cq.Name]
		if r == nil || r.n == 0 {
			continue
		}
		last := r.pts[(r.start+r.n-1)%len(r.pts)]
		d := Drain{Depth: last.Depth, Allowed: last.Allowed, Paused: last.Paused,
			MaxInFlight: cq.MaxInFlight, Concurrency: cq.Concurrency}
		var sum float64
		var n int
		for i := r.n - 1; i >= 0; i-- {
			p := r.pts[(r.start+i)%len(r.pts)]
			if last.T.Sub(p.T) >= window {
				break
			}
			if p.Delivered != nil {
				sum += *p.Delivered
				n++
			}
		}
		if n > 0 {
			d.Delivered = sum / float64(n)
		}
		out[cq.Name] = d
	}
	return out
}
