package admin

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// clock is a settable clock for the sampler.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time            { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration)       { c.mu.Lock(); defer c.mu.Unlock(); c.t = c.t.Add(d) }
func newClock(t time.Time) *clock          { return &clock{t: t} }
func sampled(h *History, q string) []Point { pts, _ := h.Of(q); return pts }

// historyEnv is a real admin server (queues, operating API, history, health) over real
// JetStream for the queues orders (5/s) and reports (2/s), whose sampler runs on a clock the
// test moves.
type historyEnv struct {
	addr  string
	qs    *queue.Queues
	reg   *prometheus.Registry
	cfg   atomic.Pointer[config.Config]
	clock *clock
	h     *History
	js    jetstream.JetStream
	name  string // the queues' prefix
}

func newHistoryEnv(t *testing.T, extra string) *historyEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	js, err := jetstream.New(testenv.Connect(t, testenv.NATS(t).URL))
	if err != nil {
		t.Fatal(err)
	}
	e := &historyEnv{reg: prometheus.NewRegistry(), clock: newClock(time.Now().Add(-2 * time.Hour)), js: js, name: testenv.Name(t)}
	if e.qs, err = queue.New(ctx, js, queue.Options{Prefix: e.name}); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("t.yaml", []byte("queues:\n  - { name: orders, rate: 5/s, max_in_flight: 8, concurrency: 2 }\n  - { name: reports, rate: 2/s }\n"+extra), nil)
	if err != nil {
		t.Fatal(err)
	}
	e.cfg.Store(cfg)
	var specs []queue.Spec
	for _, q := range cfg.Queues {
		specs = append(specs, queue.Spec{Name: q.Name, MaxDepth: 100000})
	}
	if err := e.qs.Provision(ctx, specs); err != nil {
		t.Fatal(err)
	}
	s := New("127.0.0.1:0", e.reg)
	queues := &Queues{Info: e.qs, Config: e.cfg.Load, Controls: e.qs.Controls, Now: e.clock.Now}
	queues.Mount(s)
	if err := (&Ops{Q: e.qs, Queues: queues, Gatherer: e.reg}).Mount(s, e.reg); err != nil {
		t.Fatal(err)
	}
	e.h = &History{Queues: queues, Now: e.clock.Now,
		Counts: func(ctx context.Context) (map[string]queue.Counts, error) { return e.qs.Counts(ctx, false) }}
	e.h.Mount(s)
	(&Health{Server: s, Queues: queues}).Mount(s)
	(&Jobs{Q: e.qs, Queues: queues}).Mount(s)
	e.addr = serve(t, s, "127.0.0.1:0")
	return e
}

// publish publishes n direct jobs to q and returns their ids.
func (e *historyEnv) publish(t testing.TB, q string, n int) []string {
	t.Helper()
	ids := make([]string, 0, n)
	for range n {
		rc, err := e.qs.Publish(context.Background(), &queue.Job{Queue: q, Direct: true, Body: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, rc.ID)
	}
	return ids
}

// sample moves the clock by d and has the server take a sample.
func (e *historyEnv) sample(t testing.TB, d time.Duration) {
	t.Helper()
	e.clock.Add(d)
	if err := e.h.Sample(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func getJSON(t testing.TB, addr, path string, v any) {
	t.Helper()
	res, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("GET %s: %s %s", path, res.Status, b)
	}
	if err := json.NewDecoder(res.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
}

// TestHistorySamples: the sampler records depth from the stream listing, the drain rate from
// how many jobs left between two samples, and the allowed rate (0 and paused while an operator
// pauses the queue); the API serves it oldest first, and ?since= cuts it.
func TestHistorySamples(t *testing.T) {
	e := newHistoryEnv(t, "")
	ids := e.publish(t, "orders", 10)
	e.sample(t, 0)
	for _, id := range ids[:5] {
		if _, err := e.qs.Cancel(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	e.sample(t, 5*time.Second)
	if _, err := e.qs.SetControl(context.Background(), "orders", func(c *queue.Control) { c.Paused = true }); err != nil {
		t.Fatal(err)
	}
	e.sample(t, 5*time.Second)

	var v historyView
	getJSON(t, e.addr, "/v1/queues/orders/history", &v)
	if len(v.Points) != 3 || v.Interval != 5 {
		t.Fatalf("history: %+v", v)
	}
	p0, p1, p2 := v.Points[0], v.Points[1], v.Points[2]
	if p0.Depth != 10 || p0.Delivered != nil || p0.Allowed != 5 {
		t.Errorf("first point %+v, want depth 10, no rate, allowed 5", p0)
	}
	if p1.Depth != 5 || p1.Delivered == nil || *p1.Delivered != 1 || p1.T.Sub(p0.T) != 5*time.Second {
		t.Errorf("second point %+v, want depth 5, 1 job/s delivered, 5 s later", p1)
	}
	if !p2.Paused || p2.Allowed != 0 || *p2.Delivered != 0 {
		t.Errorf("third point %+v, want paused, allowed 0, delivered 0", p2)
	}
	getJSON(t, e.addr, "/v1/queues/orders/history?since=6", &v)
	if len(v.Points) != 2 {
		t.Errorf("since=6 kept %d points, want 2", len(v.Points))
	}
	var all struct{ Queues []historyView }
	getJSON(t, e.addr, "/v1/history", &all)
	if len(all.Queues) != 2 || all.Queues[1].Queue != "reports" || len(all.Queues[1].Points) != 3 {
		t.Errorf("all: %+v", all)
	}
}

// TestHistoryBounded: a queue keeps its last Points samples and no more, and queues beyond
// MaxQueues are not sampled.
func TestHistoryBounded(t *testing.T) {
	e := newHistoryEnv(t, "")
	e.h.Points, e.h.MaxQueues = 4, 1
	for range 10 {
		e.sample(t, 5*time.Second)
	}
	pts := sampled(e.h, "orders")
	if len(pts) != 4 || !pts[3].T.Equal(e.clock.Now().UTC()) || pts[3].T.Sub(pts[0].T) != 15*time.Second {
		t.Errorf("kept %d points (%v … %v), want the last 4", len(pts), pts[0].T, pts[len(pts)-1].T)
	}
	if _, ok := e.h.Of("reports"); ok {
		t.Error("a queue beyond MaxQueues was sampled")
	}
}

// TestDesiredWorkers: the pure rule, step by step.
func TestDesiredWorkers(t *testing.T) {
	for _, c := range []struct {
		name string
		d    Drain
		want int
	}{
		{"idle, no workers", Drain{}, 0},
		{"jobs wait, no worker: one, to measure", Drain{Depth: 10, Allowed: 50}, 1},
		{"backlog the rate can use: rate / per-worker rate", Drain{Workers: 2, Depth: 1000, Delivered: 10, Allowed: 50}, 10},
		{"capped by max_in_flight / concurrency", Drain{Workers: 2, Depth: 1000, Delivered: 10, Allowed: 50, MaxInFlight: 16, Concurrency: 4}, 4},
		{"rate met: more would only wait", Drain{Workers: 3, Depth: 100000, Delivered: 49, Allowed: 50}, 3},
		{"paused: stays put", Drain{Workers: 3, Depth: 100000, Allowed: 0, Paused: true}, 3},
		{"throttled to 0 by an upstream", Drain{Workers: 2, Depth: 5, Delivered: 10, Allowed: 0}, 2},
		{"empty queue: what the arrivals need", Drain{Workers: 4, Delivered: 8, Allowed: 50}, 4},
		{"empty and quiet", Drain{Workers: 4, Allowed: 50}, 0},
		{"stuck upstream: not raised", Drain{Workers: 2, Depth: 50, Allowed: 50}, 2},
		{"bounded", Drain{Workers: 1, Depth: 1, Delivered: 0.001, Allowed: 1e6}, maxDesiredWorkers},
	} {
		if got := DesiredWorkers(c.d); got != c.want {
			t.Errorf("%s: %+v: %d, want %d", c.name, c.d, got, c.want)
		}
	}
}

// TestDesiredWorkersMetric: sluice_queue_desired_workers, from what the server sampled of a
// real queue: it rises above the workers draining when a backlog waits that the rate could
// drain faster, and does not move while the queue is paused, backlog or not.
func TestDesiredWorkersMetric(t *testing.T) {
	e := newHistoryEnv(t, "")
	workers := map[string]int{"orders": 1, "reports": 1}
	e.reg.MustRegister(e.h.DesiredMetric(func() (map[string]int, bool) { return workers, true }))
	desired := func() float64 {
		return testenv.Metric(t, e.reg, "sluice_queue_desired_workers", "queue", "orders")
	}
	ids := e.publish(t, "orders", 40)
	e.sample(t, 0)
	// One worker drains 1 job/s of a queue allowed 5/s, with 35 jobs waiting: it can use 4
	// (max_in_flight 8 / concurrency 2), not the 5 the rate alone would take.
	for i := range 4 {
		for _, id := range ids[i*5 : i*5+5] {
			if _, err := e.qs.Cancel(context.Background(), id); err != nil {
				t.Fatal(err)
			}
		}
		e.sample(t, 5*time.Second)
	}
	if got := desired(); got != 4 {
		t.Errorf("backlog, 1 worker at 1/s, rate 5/s, cap 4: desired %v, want 4", got)
	}
	workers["orders"] = 2
	if _, err := e.qs.SetControl(context.Background(), "orders", func(c *queue.Control) { c.Paused = true }); err != nil {
		t.Fatal(err)
	}
	e.publish(t, "orders", 100)
	e.sample(t, 5*time.Second)
	if got := desired(); got != 2 {
		t.Errorf("paused with a deeper backlog: desired %v, want the 2 workers it has", got)
	}
	if got := testenv.Metric(t, e.reg, "sluice_queue_desired_workers", "queue", "reports"); got != 0 {
		t.Errorf("an empty, quiet queue: desired %v, want 0", got)
	}
}
