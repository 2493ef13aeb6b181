package worker

import (
	"context"
	"runtime"
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
