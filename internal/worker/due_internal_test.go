package worker

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"
)

// A runner's mover waits until its own queue has a schedule stream: another queue's does not
// wake it, its own does at once, one known before it waits lets it go at once, and the end of
// its context ends the wait.
func TestSchedulesWait(t *testing.T) {
	var s schedules
	s.add("early")
	if !s.wait(context.Background(), "early") {
		t.Fatal("a queue added before the wait: wait returned false")
	}
	woke := make(chan bool, 1)
	go func() { woke <- s.wait(context.Background(), "late") }()
	for deadline := time.Now().Add(5 * time.Second); ; {
		s.mu.Lock()
		_, waiting := s.waiting["late"]
		s.mu.Unlock()
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the wait never started")
		}
		runtime.Gosched()
	}
	s.add("other")
	s.mu.Lock()
	_, still := s.waiting["late"]
	s.mu.Unlock()
	if !still {
		t.Fatal("another queue's schedule stream ended the wait")
	}
	s.add("late")
	if !<-woke {
		t.Fatal("wait returned false once its queue was added")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if s.wait(ctx, "never") {
		t.Fatal("wait returned true for a queue never added")
	}
}

// fakeMover counts its MoveDue calls, failing the first fails of them.
type fakeMover struct {
	mu    sync.Mutex
	calls int
	fails int
	moved chan int
}

func (f *fakeMover) MoveDue(ctx context.Context, _ string, _ int, _ time.Duration, _ context.Context) (int, error) {
	f.mu.Lock()
	f.calls++
	n := f.calls
	f.mu.Unlock()
	if n <= f.fails {
		return 0, errors.New("no mover yet")
	}
	select {
	case f.moved <- n:
	case <-ctx.Done():
	}
	return 1, nil
}

func (f *fakeMover) WatchSchedules(context.Context, func(string)) error { return nil }

// TestMoverRun: a queue's mover moves nothing until its queue has a schedule stream, then
// moves its due jobs, trying again after a failed move, until its queue stops.
func TestMoverRun(t *testing.T) {
	var s schedules
	fm := &fakeMover{fails: 2, moved: make(chan int)}
	m := &mover{env: testEnv("q", func() *QueueConfig { return &QueueConfig{} }), mv: fm, schedules: &s,
		cut: context.Background}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.run(ctx) }()
	s.add("other")
	s.add("q")
	if n := <-fm.moved; n != 3 {
		t.Fatalf("first move at call %d, want 3 (after two failures)", n)
	}
	<-fm.moved
	cancel()
	<-done

	// A broker that moves nothing: the mover ends at once.
	(&mover{env: m.env, schedules: &s, cut: context.Background}).run(context.Background())
}
