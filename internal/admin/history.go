package admin

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/queue"
)

// History defaults.
const (
	// DefaultHistoryInterval is the time between two samples of every queue.
	DefaultHistoryInterval = 5 * time.Second
	// DefaultHistoryPoints is how many samples a queue keeps: an hour at 5 s.
	DefaultHistoryPoints = 720
	// DefaultHistoryQueues caps the queues sampled (the first ones in config order); the memory
	// bound is DefaultHistoryPoints × DefaultHistoryQueues × 128 bytes ≈ 92 MB (96 bytes a point
	// of an interval without deliveries, 128 with the workers' figures).
	DefaultHistoryQueues = 1000
	// historySlowEvery: a queue that was idle (empty, nothing delivered) and not viewed for
	// an hour has its allowed rate (Redis reads) refreshed every historySlowEvery samples.
	historySlowEvery = 12
)

// Point is one sample of a queue.
type Point struct {
	// T is when it was taken.
	T time.Time `json:"t"`
	// Delivered is the jobs per second that left the queue (delivered, dead-lettered or
	// canceled) since the previous sample; absent on a queue's first sample.
	Delivered *float64 `json:"delivered"`
	// Allowed is the effective rate at T: deliveries per second allowed, 0 while paused.
	Allowed float64 `json:"allowed"`
	// Depth is the number of jobs in the queue at T, waiting and in flight.
	Depth uint64 `json:"depth"`
	// Paused is whether deliveries were paused at T.
	Paused bool `json:"paused,omitempty"`
	// R429Share and R5xxShare are the shares (0 to 1) of the workers' delivery attempts since
	// the previous sample answered 429 and 5xx; TiqP50Ms and TiqP99Ms the median and 99th
	// percentile of those attempts' time in queue (from the job's acceptance), in ms, exact to
	// the width of History.TimeInQueueBounds' bucket. Null when the workers made no attempt
	// in the interval or none said (see History.Workers).
	R429Share *float64 `json:"r429_share"`
	R5xxShare *float64 `json:"r5xx_share"`
	TiqP50Ms  *float64 `json:"tiq_p50_ms"`
	TiqP99Ms  *float64 `json:"tiq_p99_ms"`
}

// History keeps the recent history of every queue in the ingress's memory: a ring of Points
// per queue, sampled every Interval, so that a dashboard draws the last hour at once on load.
// Memory is bounded by Points × MaxQueues points (96 to 128 bytes each).
//
// A sample costs one paged stream listing (Counts: one request per 256 queues) for the depths
// and drain rates of every queue, one read of the operators' controls, and, per queue that was
// active or viewed in the last hour, the Redis reads of its upstream pause and learned rate;
// an idle queue's are refreshed every 12th sample only. Fill in the fields, Mount it and Run
// it; its methods are safe for concurrent use.
//
// The workers' figures (the shares of 429 and 5xx answers, time in queue) come from their
// presence entries, read once a sample through Workers: each worker's cumulative counters,
// differenced against the previous sample's (see answerDeltas). They lag by up to the
// workers' announcement period (5 s).
type History struct {
	// Queues supplies the config and the pause and rate reads. Required.
	Queues *Queues
	// Counts reads every queue's stream counters at once (*queue.Queues.Counts). Required.
	Counts func(ctx context.Context) (map[string]queue.Counts, error)
	// Interval, Points and MaxQueues: zero means DefaultHistoryInterval, DefaultHistoryPoints
	// and DefaultHistoryQueues.
	Interval  time.Duration
	Points    int
	MaxQueues int
	// Now is the clock of the samples. Nil: time.Now.
	Now func() time.Time
	// Workers reads the workers' presence entries, with their Answers. Nil: the points carry
	// no 429/5xx shares nor time in queue.
	Workers func(ctx context.Context) ([]Worker, error)
	// TimeInQueueBounds are the upper bounds of the workers' time-in-queue buckets
	// (worker.TimeInQueueBounds).
	TimeInQueueBounds []time.Duration

	mu      sync.Mutex
	rings   map[string]*ring
	ticks   int
	marks   map[string]workerMark // the workers' counters at marksAt, by worker id
	marksAt time.Time             // the last sample whose workers were read; zero: none
}

// ring is a queue's samples, oldest first from start.
type ring struct {
	pts      []Point
	start, n int
	left     uint64    // Left at the last sample
	active   time.Time // last sample with jobs waiting or delivered
	viewed   time.Time // last read through the API
	allowed  float64   // the last allowed rate read
	paused   bool
	readOnce bool
}

func (r *ring) push(p Point) {
	if r.n < len(r.pts) {
		r.pts[(r.start+r.n)%len(r.pts)] = p
		r.n++
		return
	}
	r.pts[r.start] = p
	r.start = (r.start + 1) % len(r.pts)
}

func (r *ring) points() []Point {
	out := make([]Point, 0, r.n)
	for i := range r.n {
		out = append(out, r.pts[(r.start+i)%len(r.pts)])
	}
	return out
}

func (h *History) interval() time.Duration {
	if h.Interval > 0 {
		return h.Interval
	}
	return DefaultHistoryInterval
}

func (h *History) now() time.Time {
	if h.Now != nil {
		return h.Now()
	}
	return time.Now()
}

// Run samples every Interval until ctx ends, and returns nil then.
func (h *History) Run(ctx context.Context) error {
	t := time.NewTicker(h.interval())
	defer t.Stop()
	for {
		sctx, cancel := context.WithTimeout(ctx, h.interval())
		_ = h.Sample(sctx) // a failed sample leaves a gap; the next one fills in
		cancel()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Sample takes one sample of every configured queue (up to MaxQueues) at Now. It returns the
// error of the stream listing; a queue whose pause cannot be read keeps its last allowed rate.
func (h *History) Sample(ctx context.Context) error {
	counts, err := h.Counts(ctx)
	if err != nil {
		return err
	}
	var controls map[string]queue.Control
	if h.Queues.Controls != nil {
		controls, _ = h.Queues.Controls(ctx)
	}
	var workers []Worker
	werr := errNoWorkers
	if h.Workers != nil {
		workers, werr = h.Workers(ctx)
	}
	now := h.now()
	cfg := h.Queues.Config()
	points, maxQ := h.Points, h.MaxQueues
	if points <= 0 {
		points = DefaultHistoryPoints
	}
	if maxQ <= 0 {
		maxQ = DefaultHistoryQueues
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rings == nil {
		h.rings = map[string]*ring{}
	}
	h.ticks++
	answers := h.answers(workers, werr, now)
	keep := make(map[string]bool, len(cfg.Queues))
	for i := range cfg.Queues[:min(len(cfg.Queues), maxQ)] {
		cq := &cfg.Queues[i]
		c, ok := counts[cq.Name]
		if !ok {
			continue // not provisioned yet
		}
		keep[cq.Name] = true
		r := h.rings[cq.Name]
		if r == nil {
			r = &ring{pts: make([]Point, points)}
			h.rings[cq.Name] = r
		}
		h.sampleQueue(ctx, r, cq, c, controls[cq.Name], now, answers[cq.Name])
	}
	for name := range h.rings {
		if !keep[name] {
			delete(h.rings, name) // no longer configured
		}
	}
	return nil
}

// answers sums the workers' attempts per queue since the last sample, from the entries ws
// read at now (werr: their read failed, so the next sample starts over). The caller holds h.mu.
func (h *History) answers(ws []Worker, werr error, now time.Time) map[string]Answers {
	if werr != nil {
		h.marks, h.marksAt = nil, time.Time{}
		return nil
	}
	sums, marks := answerDeltas(h.marks, h.marksAt, ws)
	h.marks, h.marksAt = marks, now
	return sums
}

// errNoWorkers: History.Workers is nil.
var errNoWorkers = errors.New("admin: no worker reader")

// sampleQueue adds the sample of queue cq at now to r, from its counts c, control ctl and the
// workers' attempts a since the previous sample. The caller holds h.mu.
func (h *History) sampleQueue(ctx context.Context, r *ring, cq *config.Queue, c queue.Counts, ctl queue.Control, now time.Time, a Answers) {
	p := Point{T: now.UTC(), Depth: c.Depth}
	answerFigures(&p, a, h.TimeInQueueBounds)
	if r.n > 0 {
		dt := now.Sub(r.pts[(r.start+r.n-1)%len(r.pts)].T).Seconds()
		if dt > 0 && c.Left >= r.left {
			d := math.Round(float64(c.Left-r.left)/dt*1000) / 1000
			p.Delivered = &d
		}
	}
	if c.Depth > 0 || (p.Delivered != nil && *p.Delivered > 0) {
		r.active = now
	}
	hot := now.Sub(r.active) < time.Hour || now.Sub(r.viewed) < time.Hour
	if !r.readOnce || hot || h.ticks%historySlowEvery == 0 {
		r.allowed, r.paused = h.Queues.allowed(ctx, cq, ctl, now)
		r.readOnce = true
	}
	p.Allowed, p.Paused = r.allowed, r.paused
	r.left = c.Left
	r.push(p)
}

// allowed is the effective rate of cq at now, given its control c: the runtime or file rate,
// lowered to what an adaptive queue learned, 0 while paused by an operator or an upstream.
func (q *Queues) allowed(ctx context.Context, cq *config.Queue, c queue.Control, now time.Time) (float64, bool) {
	rate := cq.Rate.PerSecond()
	if rt, err := config.ParseRate(c.Rate); c.Rate != "" && err == nil {
		rate = rt.PerSecond()
	}
	if c.PausedAt(now) {
		return 0, true
	}
	if q.PausedUntil != nil {
		if until, paused, err := q.PausedUntil(ctx, cq.Name); err == nil && paused && until.After(now) {
			return 0, true
		}
	}
	if cq.Adaptive && q.Learned != nil {
		if eff, ok, err := q.Learned(ctx, cq.Name); err == nil && ok && eff < rate {
			rate = eff
		}
	}
	return rate, false
}

// Of returns the samples of queue name, oldest first, and false when it has none; it marks
// the queue viewed, so that its allowed rate is read at every sample for the next hour.
func (h *History) Of(name string) ([]Point, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rings[name]
	if r == nil {
		return nil, false
	}
	r.viewed = h.now()
	return r.points(), true
}

// historyView is the body of the history endpoints.
type historyView struct {
	Queue    string  `json:"queue"`
	Interval float64 `json:"interval_seconds"`
	Points   []Point `json:"points"`
}

// Mount serves the history on s:
//
//	GET /v1/queues/{queue}/history   {"queue","interval_seconds","points":[Point…]}, oldest first
//	GET /v1/history                  {"queues":[…]}: every sampled queue's, in config order
//
// ?since=<seconds> keeps the points of the last so many seconds only.
func (h *History) Mount(s *Server) {
	s.Handle("GET /v1/queues/{queue}/history", http.HandlerFunc(h.one))
	s.Handle("GET /v1/history", http.HandlerFunc(h.all))
}

func (h *History) view(name string, since time.Duration) (historyView, bool) {
	pts, ok := h.Of(name)
	if !ok {
		return historyView{}, false
	}
	if since > 0 {
		cut := h.now().Add(-since)
		i := 0
		for i < len(pts) && pts[i].T.Before(cut) {
			i++
		}
		pts = pts[i:]
	}
	return historyView{Queue: name, Interval: h.interval().Seconds(), Points: pts}, true
}

func since(r *http.Request) time.Duration {
	if s := r.URL.Query().Get("since"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			return time.Duration(n) * time.Second
		}
	}
	return 0
}

func (h *History) one(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("queue")
	if _, ok := h.Queues.Config().Queue(name); !ok {
		writeProblem(w, http.StatusNotFound, "Unknown queue", "no queue named "+strconv.Quote(name))
		return
	}
	v, ok := h.view(name, since(r))
	if !ok {
		v = historyView{Queue: name, Interval: h.interval().Seconds(), Points: []Point{}}
	}
	writeJSON(w, http.StatusOK, v)
}

func (h *History) all(w http.ResponseWriter, r *http.Request) {
	cfg := h.Queues.Config()
	out := struct {
		Queues []historyView `json:"queues"`
	}{Queues: []historyView{}}
	for _, cq := range cfg.Queues {
		if v, ok := h.view(cq.Name, since(r)); ok {
			out.Queues = append(out.Queues, v)
		}
	}
	writeJSON(w, http.StatusOK, out)
}
