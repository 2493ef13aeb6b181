package leaky

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// The conformance suite: every test here runs against Memory and against Redis (a real
// redis-server) with the scripts' clock replaced by a fixed, test-driven one.

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type driver struct {
	name string
	new  func(t *testing.T, now func() time.Time) Schedule
}

// drivers returns the Memory driver and a Redis driver using one redis-server for the whole test,
// isolated per subtest by key prefix — or, while TestRedisClusterSchedule runs, the Redis
// Cluster driver alone.
func drivers(t *testing.T) []driver {
	if onCluster != nil {
		c := onCluster
		return []driver{{"redis-cluster", func(t *testing.T, now func() time.Time) Schedule {
			return NewRedis(c.Client, RedisConfig{Prefix: testenv.Prefix(t), Now: now})
		}}}
	}
	srv := testenv.Redis(t)
	return []driver{
		{"memory", func(t *testing.T, now func() time.Time) Schedule { return NewMemory(now) }},
		{"redis", func(t *testing.T, now func() time.Time) Schedule {
			return NewRedis(srv.Client, RedisConfig{Prefix: testenv.Prefix(t), Now: now})
		}},
	}
}

// onCluster is the Redis Cluster that drivers hands out while TestRedisClusterSchedule runs.
var onCluster *testenv.RedisClusterServer

// TestRedisClusterSchedule runs the schedule's tests against a real three-node Redis Cluster
// (one cluster for all of them: starting one takes seconds). Each queue's state is one
// {hash-tagged} key, so each script touches one slot.
func TestRedisClusterSchedule(t *testing.T) {
	onCluster = testenv.RedisCluster(t)
	defer func() { onCluster = nil }()
	for name, f := range map[string]func(*testing.T){
		"Steps": TestSteps, "SpacingProperty": TestSpacingProperty, "QueuesAreIndependent": TestQueuesAreIndependent,
		"Pause": TestPauseNonPositiveDoesNothing, "ConcurrentTakes": TestConcurrentTakes,
		"Wait": TestWait, "WaitGivesUpLateSlots": TestWaitGivesUpLateSlots, "TenantPauses": TestTenantPauses,
		"CostSteps": TestCostSteps, "CostWindowProperty": TestCostWindowProperty,
		"TakeN": TestTakeNIsTakesInARow, "CoalescedTakes": TestCoalescedTakes,
	} {
		t.Run(name, f)
	}
}

// forEach runs f against every driver with a fresh schedule on a fixed clock.
func forEach(t *testing.T, f func(t *testing.T, s Schedule, c *clock)) {
	forDrivers(t, drivers(t), f)
}

func forDrivers(t *testing.T, ds []driver, f func(t *testing.T, s Schedule, c *clock)) {
	for _, d := range ds {
		t.Run(d.name, func(t *testing.T) {
			c := newClock()
			f(t, d.new(t, c.Now), c)
		})
	}
}

const ms = time.Millisecond

var perSecond10 = Rate{Interval: 100 * ms}

func take(t *testing.T, s Schedule, queue string, r Rate) time.Duration {
	t.Helper()
	slot, err := s.Take(context.Background(), queue, r)
	if err != nil {
		t.Fatalf("Take(%q, %v): %v", queue, r, err)
	}
	return slot.Wait
}

// step is one action of a step test: advance the clock, then take (expecting wait) or pause.
type step struct {
	advance time.Duration
	rate    Rate
	pause   time.Duration // if > 0: Pause instead of Take
	wait    time.Duration // expected Slot.Wait of a Take
	paused  time.Duration // expected PausedFor after the step
}

func runSteps(t *testing.T, s Schedule, c *clock, steps []step) {
	t.Helper()
	ctx := context.Background()
	for i, st := range steps {
		c.Advance(st.advance)
		if st.pause > 0 {
			if err := s.Pause(ctx, "q", st.pause); err != nil {
				t.Fatalf("step %d: Pause: %v", i, err)
			}
		} else {
			slot, err := s.Take(ctx, "q", st.rate)
			if err != nil {
				t.Fatalf("step %d: Take: %v", i, err)
			}
			if slot.Wait != st.wait {
				t.Fatalf("step %d (%+v): wait %v, want %v", i, st, slot.Wait, st.wait)
			}
			if want := c.Now().Add(st.wait); !slot.At.Equal(want) {
				t.Fatalf("step %d: At %v, want %v", i, slot.At, want)
			}
		}
		p, err := s.PausedFor(ctx, "q")
		if err != nil {
			t.Fatalf("step %d: PausedFor: %v", i, err)
		}
		if p != st.paused {
			t.Fatalf("step %d (%+v): PausedFor %v, want %v", i, st, p, st.paused)
		}
	}
}

func TestSteps(t *testing.T) {
	r10 := perSecond10
	b3 := Rate{Interval: 100 * ms, Burst: 3}
	r2 := Rate{Interval: 500 * ms}
	r100 := Rate{Interval: 10 * ms}
	tests := []struct {
		name  string
		steps []step
	}{
		{"strict spacing at one instant", []step{
			{rate: r10, wait: 0}, {rate: r10, wait: 100 * ms}, {rate: r10, wait: 200 * ms},
			{rate: r10, wait: 300 * ms}, {rate: r10, wait: 400 * ms},
		}},
		{"slots keep their spacing as time passes", []step{
			{rate: r10, wait: 0}, {rate: r10, wait: 100 * ms}, {rate: r10, wait: 200 * ms},
			{advance: 150 * ms, rate: r10, wait: 150 * ms}, // slot at 300ms
			{advance: 350 * ms, rate: r10, wait: 0},        // now 500ms > next TAT 400ms
			{advance: 10 * ms, rate: r10, wait: 90 * ms},   // 600ms
		}},
		{"idleness does not bank slots without burst", []step{
			{rate: r10, wait: 0}, {advance: time.Hour, rate: r10, wait: 0},
			{rate: r10, wait: 100 * ms}, {rate: r10, wait: 200 * ms},
		}},
		{"burst after idleness", []step{
			{rate: b3, wait: 0}, {rate: b3, wait: 0}, {rate: b3, wait: 0}, {rate: b3, wait: 0},
			{rate: b3, wait: 100 * ms}, {rate: b3, wait: 200 * ms},
			// Long idleness refills the burst, but never more than it.
			{advance: time.Hour, rate: b3, wait: 0}, {rate: b3, wait: 0}, {rate: b3, wait: 0},
			{rate: b3, wait: 0}, {rate: b3, wait: 100 * ms},
		}},
		{"burst refills at the rate", []step{
			{rate: b3, wait: 0}, {rate: b3, wait: 0}, {rate: b3, wait: 0}, {rate: b3, wait: 0},
			{advance: 200 * ms, rate: b3, wait: 0}, {rate: b3, wait: 0}, {rate: b3, wait: 100 * ms},
		}},
		{"pause delays the next slot and reports what is left", []step{
			{rate: r10, wait: 0},
			{pause: 3 * time.Second, paused: 3 * time.Second},
			{rate: r10, wait: 3 * time.Second, paused: 3 * time.Second},
			{rate: r10, wait: 3*time.Second + 100*ms, paused: 3 * time.Second},
			{advance: time.Second, paused: 2 * time.Second, rate: r10, wait: 2*time.Second + 200*ms},
			// A shorter pause does not shorten it; a longer one extends it.
			{pause: time.Second, paused: 2 * time.Second},
			{pause: 4 * time.Second, paused: 4 * time.Second},
			{rate: r10, wait: 4 * time.Second, paused: 4 * time.Second},
			{advance: 5 * time.Second, rate: r10, wait: 0},
		}},
		{"pause beyond existing reservations", []step{
			{rate: r10, wait: 0}, {rate: r10, wait: 100 * ms}, {rate: r10, wait: 200 * ms},
			{pause: 150 * ms, paused: 150 * ms},
			// The TAT (300ms) is already past the pause: reservations just continue.
			{rate: r10, wait: 300 * ms, paused: 150 * ms},
		}},
		{"pause uses up the burst", []step{
			{rate: b3, wait: 0},
			{pause: time.Second, paused: time.Second},
			{rate: b3, wait: time.Second, paused: time.Second},
			{rate: b3, wait: time.Second + 100*ms, paused: time.Second},
			// After the pause, the burst refills at the rate.
			// 300ms after the slot at 1.1s, three slots have refilled.
			{advance: time.Second + 400*ms, rate: b3, wait: 0},
			{rate: b3, wait: 0}, {rate: b3, wait: 0}, {rate: b3, wait: 100 * ms},
		}},
		{"pause of a queue never taken from", []step{
			{pause: 2 * time.Second, paused: 2 * time.Second},
			{rate: b3, wait: 2 * time.Second, paused: 2 * time.Second},
			{rate: b3, wait: 2*time.Second + 100*ms, paused: 2 * time.Second},
		}},
		{"rate change applies from the next take", []step{
			{rate: r10, wait: 0}, {rate: r10, wait: 100 * ms}, {rate: r10, wait: 200 * ms},
			{rate: r2, wait: 700 * ms}, // 500ms after the slot at 200ms, not 100ms
			{rate: r2, wait: 1200 * ms},
			{rate: r100, wait: 1210 * ms}, {rate: r100, wait: 1220 * ms},
		}},
		{"rate change from 1/h to 10/s does not wait the hour", []step{
			{rate: Rate{Interval: time.Hour}, wait: 0},
			// Due 100ms after the slot at 1/h, which has passed.
			{advance: time.Minute, rate: r10, wait: 0},
			{rate: r10, wait: 100 * ms},
		}},
	}
	ds := drivers(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			forDrivers(t, ds, func(t *testing.T, s Schedule, c *clock) { runSteps(t, s, c, tc.steps) })
		})
	}
}

// TestSpacingProperty takes at random instants and checks every slot against the model: strictly
// spaced (burst 0) slots are exactly max(now, previous + interval).
func TestSpacingProperty(t *testing.T) {
	forEach(t, func(t *testing.T, s Schedule, c *clock) {
		rng := rand.New(rand.NewPCG(1, 2))
		r := Rate{Interval: 7 * ms}
		var prev time.Time
		for i := range 200 {
			c.Advance(time.Duration(rng.IntN(20)) * ms)
			slot, err := s.Take(context.Background(), "q", r)
			if err != nil {
				t.Fatal(err)
			}
			want := c.Now()
			if i > 0 && prev.Add(r.Interval).After(want) {
				want = prev.Add(r.Interval)
			}
			if !slot.At.Equal(want) {
				t.Fatalf("take %d: slot at %v, want %v", i, slot.At, want)
			}
			prev = slot.At
		}
	})
}

func TestQueuesAreIndependent(t *testing.T) {
	forEach(t, func(t *testing.T, s Schedule, c *clock) {
		take(t, s, "a", perSecond10)
		if err := s.Pause(context.Background(), "a", time.Minute); err != nil {
			t.Fatal(err)
		}
		if w := take(t, s, "b", perSecond10); w != 0 {
			t.Fatalf("queue b waits %v for queue a's schedule", w)
		}
		if p, err := s.PausedFor(context.Background(), "b"); err != nil || p != 0 {
			t.Fatalf("PausedFor(b) = %v, %v; want 0", p, err)
		}
	})
}

func TestInvalidRate(t *testing.T) {
	forEach(t, func(t *testing.T, s Schedule, c *clock) {
		for _, r := range []Rate{{}, {Interval: -ms}, {Interval: ms, Burst: -1}, {Interval: time.Hour, Burst: 1 << 40}} {
			if _, err := s.Take(context.Background(), "q", r); !errors.Is(err, ErrInvalidRate) {
				t.Errorf("Take(%v) error %v, want ErrInvalidRate", r, err)
			}
		}
		// Nothing was reserved by the failed takes.
		if w := take(t, s, "q", perSecond10); w != 0 {
			t.Fatalf("wait %v after invalid takes, want 0", w)
		}
	})
}

func TestPauseNonPositiveDoesNothing(t *testing.T) {
	forEach(t, func(t *testing.T, s Schedule, c *clock) {
		ctx := context.Background()
		for _, d := range []time.Duration{0, -time.Second} {
			if err := s.Pause(ctx, "q", d); err != nil {
				t.Fatal(err)
			}
		}
		if p, _ := s.PausedFor(ctx, "q"); p != 0 {
			t.Fatalf("PausedFor %v after Pause(≤0)", p)
		}
		if w := take(t, s, "q", perSecond10); w != 0 {
			t.Fatalf("wait %v after Pause(≤0)", w)
		}
	})
}

// TestIntervalRoundsUp: an interval that is not a whole microsecond is rounded up, so rounding
// never makes the rate faster.
func TestIntervalRoundsUp(t *testing.T) {
	forEach(t, func(t *testing.T, s Schedule, c *clock) {
		r := Every(3, time.Second) // 333.333333ms
		take(t, s, "q", r)
		if w := take(t, s, "q", r); w != 333334*time.Microsecond {
			t.Fatalf("wait %v, want 333.334ms", w)
		}
	})
}

// TestConcurrentTakes: many goroutines taking at one instant get distinct slots, exactly one
// interval apart, with no slot lost or doubled.
func TestConcurrentTakes(t *testing.T) {
	forEach(t, func(t *testing.T, s Schedule, c *clock) {
		const n = 64
		waits := make(chan time.Duration, n)
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				slot, err := s.Take(context.Background(), "q", Rate{Interval: ms})
				if err != nil {
					t.Error(err)
				}
				waits <- slot.Wait
			})
		}
		wg.Wait()
		close(waits)
		seen := make(map[time.Duration]bool)
		for w := range waits {
			seen[w] = true
		}
		for i := range n {
			if !seen[time.Duration(i)*ms] {
				t.Fatalf("no take got the slot at %v; got %v", time.Duration(i)*ms, seen)
			}
		}
	})
}
