package leaky

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// TestRedisAggregateRate is the accuracy goal: workers in separate "processes" (two clients, 8
// goroutines each) with a backlog deliver at the rate within 1%, never above it.
//
// The schedule runs dry only when none of the workers is ready to take a slot: the machine
// starved them. An attempt starved for more than a quarter of its span is too slow to measure;
// it is made again (up to 3 times) only when what shows the machine starved it covers at least
// half of that dry time: the slots given up (each a wake later than the tolerance) and the
// stalls of the process and of redis-server (testenv.Lag, with a PING). Otherwise it fails
// (Wait oversleeps).
func TestRedisAggregateRate(t *testing.T) {
	srv := testenv.Redis(t)
	for attempt := 1; ; attempt++ {
		msg := aggregateRate(t, srv)
		if msg == "" {
			return
		}
		t.Logf("attempt %d: %s", attempt, msg)
		if attempt == 3 {
			t.Fatalf("in 3 attempts the machine starved the workers too long to measure")
		}
	}
}

// aggregateRate is one attempt of TestRedisAggregateRate. It returns why the attempt must be
// made again (the machine starved it, and the process's stalls show it), or "".
func aggregateRate(t *testing.T, srv *testenv.RedisServer) string {
	// The process's stalls and redis-server's: a dry schedule is workers waiting for either.
	pinger := srv.NewClient()
	lag := testenv.NewLagPing(t, func() { _ = pinger.Ping(context.Background()).Err() })
	defer lag.Stop()
	const rate = 200
	r := Rate{Interval: time.Second / rate}
	prefix := testenv.Prefix(t)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	began, runnable := time.Now(), testenv.Runnable()

	type delivery struct {
		at    time.Time // when Wait returned
		sched int64     // the slot, µs of the Redis server's clock
	}
	var (
		mu         sync.Mutex
		deliveries []delivery
		wg         sync.WaitGroup
	)
	var givenUpAt []int64 // the slots given up, µs of the server's clock
	for range 2 {
		sched := NewRedis(srv.NewClient(), RedisConfig{Prefix: prefix}) // one per process, as in a worker
		for range 8 {
			s := &lastSlot{Redis: sched}
			hooks := Hooks{OnGiveUp: func(time.Duration) {
				mu.Lock()
				givenUpAt = append(givenUpAt, s.last.sched)
				mu.Unlock()
			}}
			wg.Go(func() {
				for {
					if err := WaitHooks(ctx, s, "q", r, hooks); err != nil {
						if ctx.Err() == nil {
							t.Errorf("Wait: %v", err)
						}
						return
					}
					d := delivery{time.Now(), s.last.sched}
					mu.Lock()
					deliveries = append(deliveries, d)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	if len(deliveries) < 100 {
		// 1.5 s at 200/s is 300 slots: a third of them used takes a machine that stalled.
		lost, worst := lag.Lost(began, time.Now())
		msg := fmt.Sprintf("only %d deliveries in 1.5 s at %d/s; the process and Redis stalled %v (the longest %v)",
			len(deliveries), rate, lost.Round(time.Millisecond), worst.Round(time.Millisecond))
		if lost < 500*time.Millisecond {
			t.Fatalf("%s, which does not explain it", msg)
		}
		return msg
	}
	slices.SortFunc(deliveries, func(a, b delivery) int { return cmp.Compare(a.sched, b.sched) })

	// The schedule, on the server's clock. The slots used are never closer than one interval.
	// With a backlog they are exactly one interval apart; the schedule runs dry only when none
	// of the 16 workers is ready to take a slot, which happens only when the machine starves the
	// test's goroutines (other packages' tests share its 2 cores) — that time is not "with a
	// backlog", and is left out of the accuracy check (and logged). The ±2: at the edges a
	// slot's holder can lose the race against the deadline while a later one wins.
	interval := r.Interval.Microseconds()
	for i := 1; i < len(deliveries); i++ {
		if gap := deliveries[i].sched - deliveries[i-1].sched; gap < interval {
			t.Fatalf("slots %d and %d are %dµs apart, less than the interval %dµs", i-1, i, gap, interval)
		}
	}
	first, last := deliveries[0].sched, deliveries[len(deliveries)-1].sched
	span := time.Duration(last-first) * time.Microsecond
	// The time starved is read on every slot reserved, used or given up: a dry take leaves a
	// gap beyond one interval after the slot reserved before it, and a given-up slot (a worker
	// the machine starved past its slot: not "with a backlog" either) is one interval of the
	// span with no slot used. Read on the used slots alone, a given-up slot followed by a dry
	// take was counted twice, once in the dry gap and once as given up (271 slots used in
	// 1.49s, "want 255 ± 5", under -race beside two CPU-bound loops). Slots given up before
	// the first used one or after the last leave no gap in the span.
	reserved := make([]int64, 0, len(deliveries)+len(givenUpAt))
	for _, d := range deliveries {
		reserved = append(reserved, d.sched)
	}
	var starved, late time.Duration // late: the part of starved that given-up slots prove
	for _, g := range givenUpAt {
		if g > first && g < last {
			reserved = append(reserved, g)
			starved += r.Interval
		}
	}
	late = starved
	slices.Sort(reserved)
	for i := 1; i < len(reserved); i++ {
		if gap := reserved[i] - reserved[i-1]; gap > interval {
			starved += time.Duration(gap-interval) * time.Microsecond // only a dry take leaves one
		}
	}
	if starved > 0 {
		t.Logf("the schedule ran dry for %v of %v: the workers were starved of CPU", starved, span)
		if starved > span/4 {
			var from, to time.Time
			for _, d := range deliveries {
				if from.IsZero() || d.at.Before(from) {
					from = d.at
				}
				if d.at.After(to) {
					to = d.at
				}
			}
			lost, worst := lag.Lost(from, to)
			msg := fmt.Sprintf("the schedule ran dry for %v of %v, %v of it slots given up late: too slow to measure; "+
				"the process and Redis stalled %v (the longest %v), goroutines waited %v to run",
				starved, span, late, lost.Round(time.Millisecond), worst.Round(time.Millisecond), (testenv.Runnable() - runnable).Round(time.Millisecond))
			if late+lost < starved/2 {
				t.Fatalf("%s, which does not explain it (Wait oversleeps?)", msg)
			}
			return msg
		}
	}
	tol := 0.01*float64(rate)*span.Seconds() + 2
	if want := float64(rate)*(span-starved).Seconds() + 1; math.Abs(float64(len(deliveries))-want) > tol {
		t.Errorf("%d slots used in %v of schedule (%v dry), want %.1f ± %.1f", len(deliveries), span, starved, want, tol)
	}

	// The deliveries, as observed. Each returns at or after its slot (never early; Redis runs on
	// this host, so its TIME and time.Now read the same clock) by a delay δ: the reply's trip back,
	// the timer's wake-up, the pause check. Delays vary by spread, so a 1s window of deliveries
	// holds slots from a span of 1s + spread: at most rate + burst + ⌈spread/interval⌉. Normally
	// spread < interval (5ms) and that is the "+1 for measurement jitter"; when the machine stalls
	// the test's goroutines longer, the allowance grows with the measured spread, and says so.
	minD, maxD := time.Duration(1<<62), time.Duration(0)
	at := make([]time.Time, len(deliveries))
	for i, d := range deliveries {
		delay := d.at.Sub(time.UnixMicro(d.sched))
		if delay < 0 {
			t.Fatalf("a delivery returned %v before its slot", -delay)
		}
		minD, maxD = min(minD, delay), max(maxD, delay)
		at[i] = d.at
	}
	spread := maxD - minD
	extra := max(1, int((spread+r.Interval-1)/r.Interval))
	if extra > 1 {
		t.Logf("delivery delays vary by %v (> one interval): allowing %d extra per window", spread, extra)
	}
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })

	// Total: over [first, last] there are rate × elapsed + 1 slots.
	elapsed := at[len(at)-1].Sub(at[0])
	got := float64(len(at))
	if want, tol := float64(rate)*(elapsed-starved).Seconds()+1, tol+float64(extra-1); math.Abs(got-want) > tol {
		t.Errorf("%d deliveries in %v, want %.1f ± %.1f", len(at), elapsed, want, tol)
	}
	// Never above the rate: the busiest 1s window.
	busiest := 0
	for i := range at {
		n, _ := slices.BinarySearchFunc(at[i:], at[i].Add(time.Second), func(a, b time.Time) int { return a.Compare(b) })
		busiest = max(busiest, n)
	}
	if limit := rate + int(r.Burst) + extra; busiest > limit {
		t.Errorf("a 1s window holds %d deliveries, more than %d", busiest, limit)
	}
	t.Logf("%d deliveries in %v (%.2f/s); busiest 1s window %d; delays %v–%v", len(at), elapsed, got/elapsed.Seconds(), busiest, minD, maxD)
	return ""
}

// lastSlot remembers the slot of its last take.
type lastSlot struct {
	*Redis
	last Slot
}

func (l *lastSlot) Take(ctx context.Context, queue string, r Rate) (Slot, error) {
	s, err := l.Redis.Take(ctx, queue, r)
	l.last = s
	return s, err
}
