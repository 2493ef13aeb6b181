package worker

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/queue"
)

// The pipeline over the worker's own seams: a fake broker (records in a map), a fake consumer
// and fake messages, a memory schedule, a real HTTP upstream. The process tests in cmd/worker
// run the same pipeline against real NATS and Redis; this one shows it needs neither.

// fakeBroker keeps status records and dead letters in memory; its watches wait for their end.
type fakeBroker struct {
	mu      sync.Mutex
	records map[string]queue.Status
	dead    map[string]string // job id → reason
}

func newFakeBroker() *fakeBroker {
	return &fakeBroker{records: map[string]queue.Status{}, dead: map[string]string{}}
}

func (b *fakeBroker) Record(_ context.Context, id string) (queue.Status, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	st, ok := b.records[id]
	if !ok {
		return queue.Status{}, queue.ErrNotFound
	}
	return st, nil
}

func (b *fakeBroker) ClaimAttempt(_ context.Context, st queue.Status) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if cur, ok := b.records[st.ID]; ok && (cur.State.Terminal() || cur.Attempts >= st.Attempts) {
		return queue.ErrClaimed
	}
	b.records[st.ID] = st
	return nil
}

func (b *fakeBroker) SetStatus(_ context.Context, st queue.Status) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.records[st.ID] = st
	return nil
}

func (b *fakeBroker) DeadLetter(_ context.Context, m *queue.Msg, reason string, _, attempts int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dead[m.Job.ID] = reason
	b.records[m.Job.ID] = queue.Status{ID: m.Job.ID, State: queue.StateFailed, Attempts: attempts, LastError: reason}
	return nil
}

func (b *fakeBroker) state(id string) queue.State {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.records[id].State
}

func (b *fakeBroker) Consumer(context.Context, string) (*queue.Consumer, error) {
	return nil, errors.New("fake broker: consumers come from Pool.consumer")
}

func (b *fakeBroker) LevelConsumer(context.Context, string, queue.Priority) (*queue.Consumer, error) {
	return nil, errors.New("fake broker: no priority levels")
}

func (b *fakeBroker) Records(ctx context.Context, ids []string) (map[string]queue.Status, error) {
	out := map[string]queue.Status{}
	for _, id := range ids {
		if st, err := b.Record(ctx, id); err == nil {
			out[id] = st
		}
	}
	return out, nil
}

func (b *fakeBroker) Controls(context.Context) (map[string]queue.Control, error) {
	return map[string]queue.Control{}, nil
}

func waitEnd(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }

func (b *fakeBroker) WatchControls(ctx context.Context, _ func(map[string]queue.Control)) error {
	return waitEnd(ctx)
}
func (b *fakeBroker) WatchCancels(ctx context.Context, _ func(string)) error   { return waitEnd(ctx) }
func (b *fakeBroker) Reconnects() uint64                                       { return 0 }
func (b *fakeBroker) Connected() bool                                          { return true }
func (b *fakeBroker) WatchLeaders(ctx context.Context, _ func()) error         { return waitEnd(ctx) }
func (b *fakeBroker) WatchSchedules(ctx context.Context, _ func(string)) error { return waitEnd(ctx) }
func (b *fakeBroker) MoveDue(ctx context.Context, _ string, _ int, _ time.Duration, _ context.Context) (int, error) {
	return 0, waitEnd(ctx)
}
func (b *fakeBroker) FairLayout(string) (queue.FairLayout, error) {
	return queue.FairLayout{}, queue.ErrUnknownQueue
}

// fakeConsumer hands out its jobs, each once, until a fake message of one is nak'ed or handed
// back: then that job comes again.
type fakeConsumer struct {
	mu      sync.Mutex
	ready   []*queue.Msg
	arrived chan struct{}
}

func (c *fakeConsumer) put(m *queue.Msg) {
	c.mu.Lock()
	c.ready = append(c.ready, m)
	c.mu.Unlock()
	select {
	case c.arrived <- struct{}{}:
	default:
	}
}

func (c *fakeConsumer) Fetch(ctx context.Context, n int, wait time.Duration) ([]*queue.Msg, error) {
	var t <-chan time.Time
	if wait > 0 {
		t = time.After(wait)
	}
	for {
		c.mu.Lock()
		k := min(n, len(c.ready))
		out := c.ready[:k:k]
		c.ready = c.ready[k:]
		c.mu.Unlock()
		if k > 0 || wait <= 0 {
			return out, nil
		}
		select {
		case <-c.arrived:
		case <-t:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// fakeMessage settles one delivery: it records how, and puts a nak'ed job back in its consumer
// with one more delivery.
type fakeMessage struct {
	m    *queue.Msg
	cons *fakeConsumer
	mu   sync.Mutex
	how  []string
	done chan string
}

func (f *fakeMessage) settled(how string) error {
	f.mu.Lock()
	f.how = append(f.how, how)
	f.mu.Unlock()
	f.done <- how
	return nil
}

func (f *fakeMessage) Ack(context.Context) error        { return f.settled("ack") }
func (f *fakeMessage) AckNoWait() error                 { return f.settled("ack") }
func (f *fakeMessage) Nak(context.Context) error        { return f.again("nak") }
func (f *fakeMessage) InProgress(context.Context) error { return nil }
func (f *fakeMessage) NakWithDelay(_ context.Context, _ time.Duration) error {
	return f.again("nak-delay")
}

func (f *fakeMessage) again(how string) error {
	f.cons.put(&queue.Msg{Job: f.m.Job, Delivered: f.m.Delivered + 1, Seq: f.m.Seq, Timestamp: f.m.Timestamp})
	return f.settled(how)
}

// TestPipelineWithoutNATS: jobs fetched from the worker's consumer seam are admitted at the
// queue's rate, delivered once each, recorded and acked; a job the upstream fails is nak'ed,
// comes again as attempt 2, and succeeds.
func TestPipelineWithoutNATS(t *testing.T) {
	var mu sync.Mutex
	calls := map[string][]string{} // job id → Sluice-Attempt of each delivery
	var arrivals []time.Time
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		id := r.Header.Get("Sluice-Job")
		mu.Lock()
		calls[id] = append(calls[id], r.Header.Get("Sluice-Attempt"))
		arrivals = append(arrivals, time.Now())
		n := len(calls[id])
		mu.Unlock()
		if id == "flaky" && n == 1 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer up.Close()

	b := newFakeBroker()
	cons := &fakeConsumer{arrived: make(chan struct{}, 1)}
	settled := make(chan string, 64)
	p, err := New(Deps{Queues: b, Schedule: leaky.NewMemory(nil)}, []QueueConfig{{
		Name: "q", Rate: leaky.Every(50, time.Second), Upstream: up.URL, MaxAttempts: 3,
		Timeout: 5 * time.Second, Concurrency: 4, DefaultPause: time.Second, AckWait: 30 * time.Second,
	}})
	if err != nil {
		t.Fatal(err)
	}
	p.consumer = func(context.Context, string, queue.Priority) (consumer, error) { return cons, nil }
	p.settler = func(m *queue.Msg) message { return &fakeMessage{m: m, cons: cons, done: settled} }
	SetSuspicion(p, 0)
	ids := []string{"a", "b", "c", "flaky"}
	for _, id := range ids {
		cons.put(&queue.Msg{Job: &queue.Job{ID: id, Queue: "q", Method: "POST", Path: "/x", CreatedAt: time.Now()},
			Delivered: 1, Timestamp: time.Now()})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var hows []string
	for len(hows) < len(ids)+1 { // every job acked once, and the flaky one nak'ed first
		select {
		case h := <-settled:
			hows = append(hows, h)
		case <-time.After(10 * time.Second):
			t.Fatalf("settled %v after 10s, want %d acks and a nak", hows, len(ids))
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	acks, naks := 0, 0
	for _, h := range hows {
		switch h {
		case "ack":
			acks++
		case "nak-delay":
			naks++
		}
	}
	if acks != len(ids) || naks != 1 {
		t.Fatalf("settled %v: %d acks and %d naks, want %d and 1", hows, acks, naks, len(ids))
	}
	mu.Lock()
	defer mu.Unlock()
	// Five deliveries at 50/s: four slot intervals of 20ms between the first and the last.
	if span := arrivals[len(arrivals)-1].Sub(arrivals[0]); len(arrivals) != 5 || span < 4*20*time.Millisecond-5*time.Millisecond {
		t.Errorf("%d deliveries over %v, want 5 over at least 75ms (the queue's rate)", len(arrivals), span)
	}
	for _, id := range ids {
		want := []string{"1"}
		if id == "flaky" {
			want = []string{"1", "2"}
		}
		if got := calls[id]; len(got) != len(want) || got[0] != want[0] || len(got) == 2 && got[1] != want[1] {
			t.Errorf("job %s delivered with attempts %v, want %v", id, got, want)
		}
		if st := b.state(id); st != queue.StateSucceeded {
			t.Errorf("job %s recorded %q, want succeeded", id, st)
		}
	}
}
