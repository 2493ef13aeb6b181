package app

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/admin"
	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker"
	"github.com/sluice-rl/sluice/queue"
)

// fakeCounts are the answers a presence writer of the test announces; the test changes them.
type fakeCounts struct {
	mu sync.Mutex
	m  map[string]worker.Answers
}

func (f *fakeCounts) set(m map[string]worker.Answers) { f.mu.Lock(); f.m = m; f.mu.Unlock() }
func (f *fakeCounts) get() map[string]worker.Answers {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m
}

// counted is a queue's answers: n attempts, r429 and r5xx of them so answered, all of them in
// the time-in-queue bucket tiq.
func counted(n, r429, r5xx uint64, tiq int) worker.Answers {
	a := worker.Answers{Delivered: n, R429: r429, R5xx: r5xx}
	a.TimeInQueue[tiq] = n
	return a
}

// writer runs the worker's presence writer (announce) with the answers of f, every 20ms,
// until the returned stop is called (which waits for it to withdraw its entry).
func writer(t *testing.T, js jetstream.JetStream, cfg *config.Config, f *fakeCounts) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = announce(ctx, js, func() *config.Config { return cfg }, f.get, 20*time.Millisecond, testLogger())
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// waitWorkers waits, on the presence bucket's updates, until the entries satisfy cond.
func waitWorkers(t *testing.T, js jetstream.JetStream, what string, cond func([]admin.Worker) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: presenceBucket, TTL: presenceTTL,
		History: 1, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stopWatch(ctx, w)
	for {
		ws, err := presentWorkers(ctx, js)
		if err == nil && cond(ws) {
			return
		}
		select {
		case <-w.Updates():
		case <-ctx.Done():
			t.Fatalf("presence entries never showed %s: last %+v (%v)", what, ws, err)
		}
	}
}

// delivered is cond: the workers' entries hold, per worker, these attempts of orders.
func delivered(want ...uint64) func([]admin.Worker) bool {
	return func(ws []admin.Worker) bool {
		if len(ws) != len(want) {
			return false
		}
		left := append([]uint64(nil), want...)
	next:
		for _, w := range ws {
			for i, n := range left {
				if w.Answers["orders"].Delivered == n {
					left = append(left[:i], left[i+1:]...)
					continue next
				}
			}
			return false
		}
		return true
	}
}

// Two workers' presence writers announce their cumulative answers over real NATS; the
// ingress's history sums what both counted between two samples: 40 attempts of orders, 10
// answered 429 and 4 5xx give shares 0.25 and 0.1, all in the 50–100 ms bucket give p50 and
// p99 inside it; reports, with no attempt, has null figures. A worker replaced by a new one
// (restart: new entry, counters from zero) counts from zero, not negatively.
func TestHistoryCarriesWorkersAnswers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(testenv.Connect(t, testenv.NATS(t).URL))
	if err != nil {
		t.Fatal(err)
	}
	qs, err := queue.New(ctx, js, queue.Options{Prefix: testenv.Name(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := qs.Provision(ctx, []queue.Spec{{Name: "orders"}, {Name: "reports"}}); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("t.yaml", []byte("queues:\n  - { name: orders, rate: 5/s }\n  - { name: reports, rate: 2/s }\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	h := &admin.History{
		Queues:            &admin.Queues{Info: qs, Config: func() *config.Config { return cfg }},
		Counts:            func(ctx context.Context) (map[string]queue.Counts, error) { return qs.Counts(ctx, false) },
		Workers:           func(ctx context.Context) ([]admin.Worker, error) { return presentWorkers(ctx, js) },
		TimeInQueueBounds: worker.TimeInQueueBounds[:],
	}
	const b100ms = 3 // the bucket (50ms, 100ms]
	if worker.TimeInQueueBounds[b100ms] != 100*time.Millisecond {
		t.Fatalf("bucket %d is ≤ %v; the test expects 100ms", b100ms, worker.TimeInQueueBounds[b100ms])
	}
	var a, b fakeCounts
	a.set(map[string]worker.Answers{"orders": counted(10, 1, 0, b100ms)})
	b.set(map[string]worker.Answers{"orders": counted(10, 0, 2, b100ms)})
	stopA := writer(t, js, cfg, &a)
	writer(t, js, cfg, &b)
	waitWorkers(t, js, "10 and 10", delivered(10, 10))
	sample := func() map[string]admin.Point {
		t.Helper()
		if err := h.Sample(ctx); err != nil {
			t.Fatal(err)
		}
		last := map[string]admin.Point{}
		for _, q := range []string{"orders", "reports"} {
			pts, _ := h.Of(q)
			last[q] = pts[len(pts)-1]
		}
		return last
	}
	if p := sample()["orders"]; p.R429Share != nil || p.TiqP50Ms != nil {
		t.Errorf("first sample: figures %v %v, want null (no interval yet)", p.R429Share, p.TiqP50Ms)
	}

	a.set(map[string]worker.Answers{"orders": counted(30, 11, 0, b100ms)}) // +20, 10 × 429
	b.set(map[string]worker.Answers{"orders": counted(30, 0, 6, b100ms)})  // +20, 4 × 5xx
	waitWorkers(t, js, "30 and 30", delivered(30, 30))
	pts := sample()
	o := pts["orders"]
	if o.R429Share == nil || *o.R429Share != 0.25 || o.R5xxShare == nil || *o.R5xxShare != 0.1 {
		t.Errorf("orders: 429, 5xx shares %v, %v; want 0.25 and 0.1", deref(o.R429Share), deref(o.R5xxShare))
	}
	for _, v := range []*float64{o.TiqP50Ms, o.TiqP99Ms} {
		if v == nil || *v < 50 || *v > 100 {
			t.Errorf("orders: time in queue p50/p99 %v, %v; want within (50, 100] ms", deref(o.TiqP50Ms), deref(o.TiqP99Ms))
			break
		}
	}
	js1, _ := json.Marshal(pts["reports"])
	if !strings.Contains(string(js1), `"r429_share":null`) || !strings.Contains(string(js1), `"tiq_p99_ms":null`) {
		t.Errorf("reports (no attempts): %s, want null figures", js1)
	}
	js2, _ := json.Marshal(o)
	if !strings.Contains(string(js2), `"r429_share":0.25`) || !strings.Contains(string(js2), `"r5xx_share":0.1`) {
		t.Errorf("orders point JSON %s lacks r429_share 0.25 / r5xx_share 0.1", js2)
	}

	// Worker a restarts: its entry goes, a new one starts from zero with 5 attempts, all 429.
	stopA()
	var a2 fakeCounts
	a2.set(map[string]worker.Answers{"orders": counted(5, 5, 0, b100ms)})
	writer(t, js, cfg, &a2)
	waitWorkers(t, js, "5 and 30", delivered(5, 30))
	o = sample()["orders"]
	if o.R429Share == nil || *o.R429Share != 1 || o.R5xxShare == nil || *o.R5xxShare != 0 {
		t.Errorf("after a restart: 429, 5xx shares %v, %v; want 1 and 0 (5 new attempts, all 429)", deref(o.R429Share), deref(o.R5xxShare))
	}
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}
