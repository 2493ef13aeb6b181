package worker

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/queue"
)

// newTestSlot is a leak slot of queue "q" at cfg's rate on sched, not paused, learning nothing.
func newTestSlot(cfg *QueueConfig, sched leaky.Schedule) (*leakSlot, *atomic.Int64) {
	var waiters atomic.Int64
	return &leakSlot{env: testEnv("q", func() *QueueConfig { return cfg }), takes: sched,
		health: &scheduleHealth{}, paused: func() bool { return false }, learned: func() float64 { return 0 },
		waiters: &waiters, poke: func() {}}, &waiters
}

// TestLeakSlotAdmit: each job goes at its own slot of the queue's rate, a slot apart; a job
// whose unit budget took its slot goes without another; a job whose queue stops is not sent.
func TestLeakSlotAdmit(t *testing.T) {
	cfg := &QueueConfig{Name: "q", Rate: leaky.Every(200, time.Second)}
	s, waiters := newTestSlot(cfg, leaky.NewMemory(nil))
	var slots []int64
	for i := range 3 {
		if v := s.admit(context.Background(), cfg, testJob("j", "")); v.kind != admitGo {
			t.Fatalf("job %d: %+v, want go", i, v)
		}
		slots = append(slots, s.horizon.Load())
	}
	for i := 1; i < len(slots); i++ {
		// The schedule places slots on its own reading of the clock: within a microsecond.
		if gap := time.Duration(slots[i] - slots[i-1]); gap < cfg.Rate.Interval-time.Microsecond {
			t.Fatalf("slots %d and %d %v apart, want %v", i-1, i, gap, cfg.Rate.Interval)
		}
	}
	if n := waiters.Load(); n != 0 {
		t.Fatalf("%d slot waiters after every job went, want 0", n)
	}

	charged := testJob("c", "")
	charged.charged = true
	before := s.horizon.Load()
	if v := s.admit(context.Background(), cfg, charged); v.kind != admitGo || s.horizon.Load() != before {
		t.Fatalf("a job charged by its unit budget: %+v, and a slot taken: %v", v, s.horizon.Load() != before)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if v := s.admit(ctx, cfg, testJob("x", "")); v.kind != admitRefuse || v.end != endNotSent {
		t.Fatalf("a stopped queue's job: %+v, want refused, not sent", v)
	}
}

// failingSchedule fails every take.
type failingSchedule struct {
	leaky.Schedule
	takes atomic.Int64
}

func (f *failingSchedule) Take(context.Context, string, leaky.Rate) (leaky.Slot, error) {
	f.takes.Add(1)
	return leaky.Slot{}, errors.New("connection refused")
}

// TestLeakSlotScheduleDown: a schedule that fails for storeGiveUp (each read of the clock here
// passing 500ms) refuses the job (handed back, for a worker that can reach it) and marks the
// Pool's schedule down; a later job is refused at its first failure, and a take that succeeds
// marks it up again.
func TestLeakSlotScheduleDown(t *testing.T) {
	clock := newFakeClock()
	cfg := &QueueConfig{Name: "q", Rate: leaky.Every(200, time.Second)}
	failing := &failingSchedule{Schedule: leaky.NewMemory(nil)}
	s, _ := newTestSlot(cfg, failing)
	s.env.now = func() time.Time { clock.advance(500 * time.Millisecond); return clock.now() }
	v := s.admit(context.Background(), cfg, testJob("j", ""))
	if v.kind != admitRefuse || v.end != endNotSent || !strings.Contains(v.reason, ErrScheduleDown.Error()) {
		t.Fatalf("admit on a failing schedule = %+v, want refused: %v", v, ErrScheduleDown)
	}
	if s.health.err() == nil || failing.takes.Load() < 2 {
		t.Fatalf("health %v after %d takes; want down after 2 or more", s.health.err(), failing.takes.Load())
	}
	n := failing.takes.Load()
	if v := s.admit(context.Background(), cfg, testJob("k", "")); v.kind != admitRefuse || failing.takes.Load() != n+1 {
		t.Fatalf("while down: %+v after %d more takes, want refused after one", v, failing.takes.Load()-n)
	}
	s.takes = leaky.NewMemory(nil)
	if v := s.admit(context.Background(), cfg, testJob("l", "")); v.kind != admitGo || s.health.err() != nil {
		t.Fatalf("schedule back: %+v, health %v; want go, up", v, s.health.err())
	}
}

// TestLeakSlotWaitsOutAPause: an operator's pause met just before the slot gives the slot up
// and waits for the pause to end; a job whose queue stops meanwhile is not sent.
func TestLeakSlotWaitsOutAPause(t *testing.T) {
	cfg := &QueueConfig{Name: "q", Rate: leaky.Every(200, time.Second)}
	s, _ := newTestSlot(cfg, leaky.NewMemory(nil))
	looks := 0
	s.paused = func() bool { looks++; return looks == 2 } // paused at the slot, then lifted
	if v := s.admit(context.Background(), cfg, testJob("j", "")); v.kind != admitGo || looks < 3 {
		t.Fatalf("admit = %+v after %d looks at the pause, want go after 3 or more", v, looks)
	}
	s.paused = func() bool { return true }
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if v := s.admit(ctx, cfg, testJob("k", "")); v.kind != admitRefuse || v.end != endNotSent {
		t.Fatalf("paused until the queue stops: %+v, want refused, not sent", v)
	}
}

// TestLeakSlotObserve: a job's status write waits for the apply tick only while the queue's
// slots are reserved more than a tick ahead at two or more slots a tick.
func TestLeakSlotObserve(t *testing.T) {
	clock := newFakeClock()
	for _, c := range []struct {
		name  string
		rate  leaky.Rate
		ahead time.Duration
		want  bool
	}{
		{"unthrottled: nothing reserved ahead", leaky.Every(1000, time.Second), 0, false},
		{"paced at 1000/s", leaky.Every(1000, time.Second), 50 * time.Millisecond, true},
		{"a slow queue has little to gather", leaky.Every(50, time.Second), time.Second, false},
	} {
		cfg := &QueueConfig{Name: "q", Rate: c.rate}
		s, _ := newTestSlot(cfg, leaky.NewMemory(nil))
		s.env.now = clock.now
		s.horizon.Store(clock.now().Add(c.ahead).UnixNano())
		j := testJob("j", "")
		s.observe(cfg, j, answer{})
		if j.gather != c.want {
			t.Errorf("%s: gather %v, want %v", c.name, j.gather, c.want)
		}
	}
}

// TestLeakSlotRate: slots are taken at the config's rate, an operator's rate in its place, and
// a learned rate when that is lower.
func TestLeakSlotRate(t *testing.T) {
	cfg := &QueueConfig{Name: "q", Rate: leaky.Every(100, time.Second)}
	for _, c := range []struct {
		name     string
		operator string
		learned  float64
		want     time.Duration
	}{
		{"the config's", "", 0, 10 * time.Millisecond},
		{"an operator's", "20/s", 0, 50 * time.Millisecond},
		{"learned lower", "", 10, 100 * time.Millisecond},
		{"learned higher is no ceiling", "", 1000, 10 * time.Millisecond},
	} {
		s, _ := newTestSlot(cfg, leaky.NewMemory(nil))
		s.env.control = func() queue.Control { return queue.Control{Rate: c.operator} }
		s.learned = func() float64 { return c.learned }
		if got := s.rate().Interval; got != c.want {
			t.Errorf("%s: interval %v, want %v", c.name, got, c.want)
		}
	}
}
