package worker

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/queue"
)

// fakeClock is a clock that moves only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// testEnv is a policy's environment for a table test: queue name, config cfg, the real clock
// (set now for a fake one), a discarded log, unregistered metrics, no operator's control, and
// a config that never changes.
func testEnv(name string, cfg func() *QueueConfig) queueEnv {
	m, err := newMetrics(nil, nil)
	if err != nil {
		panic(err)
	}
	return queueEnv{name: name, cfg: cfg, now: time.Now, log: slog.New(slog.DiscardHandler), m: m,
		control: func() queue.Control { return queue.Control{} },
		until: func(ctx context.Context) bool {
			<-ctx.Done()
			return false
		}}
}

// testJob is a job in hand of queue "q".
func testJob(id, tenant string) *job {
	return &job{m: &queue.Msg{Job: &queue.Job{ID: id, Queue: "q", Tenant: tenant}, Delivered: 1}, queue: "q"}
}

// scripted is an admitter that answers its verdicts in turn (the last one again once spent),
// and records the releases and validity checks of what it let go.
type scripted struct {
	name     string
	verdicts []verdict
	calls    int
	log      *[]string
}

func (s *scripted) admit(context.Context, *QueueConfig, *job) verdict {
	v := s.verdicts[min(s.calls, len(s.verdicts)-1)]
	s.calls++
	*s.log = append(*s.log, s.name+" admit")
	if v.release != nil {
		v.release = func() { *s.log = append(*s.log, s.name+" release") }
	}
	return v
}

// TestAdmission: the admitters run in order; a hold or a refusal ends the pass, with what the
// earlier ones hold given back, the latest first; a go whose holding went stale sends the job
// through admission again.
func TestAdmission(t *testing.T) {
	clock := newFakeClock()
	holding := verdict{release: func() {}}
	stale := 0
	goneStale := verdict{release: func() {}, valid: func() bool { stale++; return stale > 1 }}
	for _, c := range []struct {
		name         string
		verdicts     [][]verdict // each admitter's, in order
		wantOut      outcome
		wantStop     bool
		wantReleases int
		wantLog      []string
	}{
		{
			name:         "all go",
			verdicts:     [][]verdict{{pass()}, {holding}, {pass()}},
			wantReleases: 1,
			wantLog:      []string{"a admit", "b admit", "c admit"},
		},
		{
			name:     "a hold ends the pass until its time, releasing what was taken",
			verdicts: [][]verdict{{holding}, {holdUntil(clock.now().Add(3*time.Second), "tenant paused")}, {pass()}},
			wantOut:  outcome{end: endHold, wait: 3 * time.Second},
			wantStop: true,
			wantLog:  []string{"a admit", "b admit", "a release"},
		},
		{
			name:     "a hold already over waits nothing",
			verdicts: [][]verdict{{holdUntil(clock.now().Add(-time.Second), "late")}},
			wantOut:  outcome{end: endHold},
			wantStop: true,
			wantLog:  []string{"a admit"},
		},
		{
			name:     "a refusal gives back the latest first",
			verdicts: [][]verdict{{holding}, {holding}, {refuse(endCanceled, "canceled")}},
			wantOut:  outcome{end: endCanceled},
			wantStop: true,
			wantLog:  []string{"a admit", "b admit", "c admit", "b release", "a release"},
		},
		{
			name:         "a stale holding: everything given back, all again",
			verdicts:     [][]verdict{{pass()}, {goneStale}, {pass()}},
			wantReleases: 1,
			wantLog: []string{"a admit", "b admit", "c admit", "b release",
				"a admit", "b admit", "c admit"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			var log []string
			var list []any
			for i, vs := range c.verdicts {
				list = append(list, &scripted{name: string(rune('a' + i)), verdicts: vs, log: &log})
			}
			ps := newPolicies(list...)
			held, out, stop := ps.admission(context.Background(), &QueueConfig{}, testJob("j", ""), clock.now)
			if stop != c.wantStop || out != c.wantOut || len(held) != c.wantReleases {
				t.Fatalf("admission = %d held, %+v, %v; want %d, %+v, %v", len(held), out, stop, c.wantReleases, c.wantOut, c.wantStop)
			}
			if !slices.Equal(log, c.wantLog) {
				t.Fatalf("calls %q, want %q", log, c.wantLog)
			}
		})
	}
}

type observeOnly struct{}

func (observeOnly) observe(*QueueConfig, *job, answer) {}

type loopOnly struct{}

func (loopOnly) run(context.Context) {}

// TestNewPolicies: each policy is listed under every hook it has, in the order given.
func TestNewPolicies(t *testing.T) {
	var log []string
	a, b := &scripted{name: "a", log: &log}, &scripted{name: "b", log: &log}
	slot := &leakSlot{}
	ps := newPolicies(a, observeOnly{}, slot, loopOnly{}, b)
	if len(ps.all) != 5 || len(ps.admit) != 3 || len(ps.observe) != 2 || len(ps.loops) != 1 {
		t.Fatalf("%d policies: %d admit, %d observe, %d run; want 5: 3, 2, 1", len(ps.all), len(ps.admit), len(ps.observe), len(ps.loops))
	}
	if ps.admit[0] != admitter(a) || ps.admit[1] != admitter(slot) || ps.admit[2] != admitter(b) {
		t.Fatal("admitters out of the given order")
	}
}

// TestEvery: a loop runs its feature while the config turns it on, and waits for a change
// (calling off once) while it does not.
func TestEvery(t *testing.T) {
	on := true
	var mu sync.Mutex
	cfg := &QueueConfig{}
	changes := make(chan struct{})
	env := testEnv("q", func() *QueueConfig { return cfg })
	env.until = func(ctx context.Context) bool {
		select {
		case <-changes:
			return true
		case <-ctx.Done():
			return false
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran, offs := make(chan struct{}, 100), make(chan struct{}, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		env.every(ctx, time.Millisecond,
			func(*QueueConfig) bool { mu.Lock(); defer mu.Unlock(); return on },
			func(context.Context) { offs <- struct{}{} },
			func(context.Context) { ran <- struct{}{} })
	}()
	<-ran
	<-ran // ticking while on
	mu.Lock()
	on = false
	mu.Unlock()
	<-offs // off once, then waiting for a change
	for len(ran) > 0 {
		<-ran
	}
	mu.Lock()
	on = true
	mu.Unlock()
	changes <- struct{}{}
	<-ran // on again after the change
	cancel()
	<-done
	if len(offs) != 0 {
		t.Fatalf("off called %d more times while waiting for one change", len(offs))
	}
}
