package testenv

import (
	"math"
	"runtime/metrics"
	"sync"
	"testing"
	"time"
)

// Lag measures the time this process lost to the machine: a goroutine sleeps LagTick at a time,
// and each wake more than LagTick later than asked is a stall, from when it should have woken to
// when it did (the process got no CPU, or its runtime stopped the world). A timing test whose
// precondition is being scheduled in time (a call answered within milliseconds, slots used
// within their tolerance, a rate held over a second or two) subtracts the stalls from what it
// measured (Lost), or tries again only when what it missed is explained by them: it proves,
// rather than assumes, that a loaded machine made it miss. Costs one wake-up per LagTick while
// it runs, and the stalls' list.
type Lag struct {
	mu     sync.Mutex
	stalls [][2]time.Time // [should have woken, woke], in order
	woke   time.Time      // the latest wake
	ping   func()         // called at each wake; nil: none
	stop   chan struct{}
	done   chan struct{}
}

// LagTick is Lag's sleep, and the least lateness it counts as a stall: a wake up to LagTick
// late (a timer's slack and the scheduler's slice on a busy machine) is not one. It is the
// tolerance of a leak slot at 50/s (leaky.Rate.Tolerance, half an interval).
const LagTick = 10 * time.Millisecond

// NewLag starts a Lag; the test's cleanup stops it.
func NewLag(t testing.TB) *Lag { return NewLagPing(t, nil) }

// NewLagPing starts a Lag that calls ping (a round trip to a server the test talks to, such as
// a Redis PING) at each wake, and counts as a stall a wake whose ping ended more than LagTick
// after it should have woken: the time the server, as well as this process, got no CPU. ping
// nil is NewLag.
func NewLagPing(t testing.TB, ping func()) *Lag {
	l := &Lag{ping: ping, stop: make(chan struct{}), done: make(chan struct{})}
	go l.run()
	t.Cleanup(l.Stop)
	return l
}

func (l *Lag) run() {
	defer close(l.done)
	timer := time.NewTimer(LagTick)
	defer timer.Stop()
	want := time.Now().Add(LagTick)
	for {
		select {
		case <-l.stop:
			return
		case <-timer.C:
			if l.ping != nil {
				l.ping()
			}
			now := time.Now()
			l.mu.Lock()
			if now.Sub(want) > LagTick {
				l.stalls = append(l.stalls, [2]time.Time{want, now})
			}
			l.woke = now
			l.mu.Unlock()
			want = now.Add(LagTick)
			timer.Reset(LagTick)
		}
	}
}

// Lost returns how much of [from, to) the process spent in stalls, and the longest of them
// that overlaps it. A stall is seen once the probe runs again: Lost first waits (up to a
// second) for its first wake after to.
func (l *Lag) Lost(from, to time.Time) (lost, worst time.Duration) {
	for deadline := time.Now().Add(time.Second); ; time.Sleep(time.Millisecond) {
		l.mu.Lock()
		if l.woke.After(to) || time.Now().After(deadline) {
			break // l.mu held
		}
		l.mu.Unlock()
	}
	defer l.mu.Unlock()
	for _, s := range l.stalls {
		a, b := s[0], s[1]
		if a.Before(from) {
			a = from
		}
		if b.After(to) {
			b = to
		}
		if b.After(a) {
			lost += b.Sub(a)
			worst = max(worst, s[1].Sub(s[0]))
		}
	}
	return lost, worst
}

// Stop ends the probe; it may be called more than once, from one goroutine.
func (l *Lag) Stop() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
}

// Runnable returns how long, in all, this process's goroutines have waited to run once ready
// (runtime/metrics /sched/latencies:seconds, each wait counted at its bucket's lower bound): a
// machine that gives the process less CPU than its goroutines want shows here even when no
// single wake is late enough for Lag. Read it before and after a window; the difference is
// the window's.
func Runnable() time.Duration {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return 0
	}
	h := s[0].Value.Float64Histogram()
	var sum float64
	for i, n := range h.Counts {
		if lo := h.Buckets[i]; n > 0 && lo > 0 && !math.IsInf(lo, 0) {
			sum += float64(n) * lo
		}
	}
	return time.Duration(sum * float64(time.Second))
}
