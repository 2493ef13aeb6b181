package worker

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/queue"
)

// Ready names the queues whose consumer a running Pool still waits for, and Started is closed
// only once every runner has its consumer (issue 44: ready means every queue can deliver).
func TestReadyWaitsForEveryConsumer(t *testing.T) {
	q := func(name string) QueueConfig {
		return QueueConfig{Name: name, Rate: leaky.Every(10, time.Second), Upstream: "http://127.0.0.1:1",
			MaxAttempts: 1, Timeout: time.Second, Concurrency: 1, DefaultPause: time.Second, AckWait: 30 * time.Second}
	}
	p, err := New(Deps{Queues: newFakeBroker(), Schedule: leaky.NewMemory(nil)}, []QueueConfig{q("a"), q("late")})
	if err != nil {
		t.Fatal(err)
	}
	var lateHere atomic.Bool
	cons := &fakeConsumer{arrived: make(chan struct{}, 1)}
	p.consumer = func(_ context.Context, name string, _ queue.Priority) (consumer, error) {
		if name == "late" && !lateHere.Load() {
			return nil, queue.ErrUnknownQueue
		}
		return cons, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for err := p.Ready(); err == nil || !strings.Contains(err.Error(), `1 of 2 queues not fetching yet, their consumer not found: "late"`); err = p.Ready() {
		if time.Now().After(deadline) {
			t.Fatalf("Ready() = %v, want it to name queue \"late\"", err)
		}
		time.Sleep(5 * time.Millisecond) // polling a method: nothing to wait on
	}
	select {
	case <-p.Started():
		t.Fatal("Started closed while queue \"late\" has no consumer")
	default:
	}
	lateHere.Store(true) // the runner retries after consumerBackoff (100 ms, doubling)
	select {
	case <-p.Started():
	case <-time.After(5 * time.Second):
		t.Fatal("Started not closed 5s after every consumer could be had")
	}
	if err := p.Ready(); err != nil {
		t.Errorf("Ready() = %v once every runner has its consumer, want nil", err)
	}
}
