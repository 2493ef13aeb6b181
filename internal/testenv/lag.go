package testenv

import (
	"sync"
	"testing"
	"time"
)

// Lag measures how much time this process lost to the machine: a goroutine sleeps Tick at a
// time and adds up, for each wake more than Tick later than asked, how late it was. A timing
// test whose precondition is being scheduled in time (a slot used within its tolerance, a rate
// held over a second or two) reads Stalled over its window, and tries again only when what it
// missed is explained by that time: it proves, rather than assumes, that a loaded machine made
// it miss. Costs one wake-up per Tick while it runs.
type Lag struct {
	mu      sync.Mutex
	stalled time.Duration
	worst   time.Duration
	stop    chan struct{}
	done    chan struct{}
}

// LagTick is Lag's sleep, and the least lateness it counts: a wake up to LagTick late (a
// timer's slack and the scheduler's slice on a busy machine) is not counted. It is the
// tolerance of a leak slot at 50/s (leaky.Rate.Tolerance, half an interval).
const LagTick = 10 * time.Millisecond

// NewLag starts a Lag; the test's cleanup stops it.
func NewLag(t testing.TB) *Lag {
	l := &Lag{stop: make(chan struct{}), done: make(chan struct{})}
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
			if late := time.Since(want); late > LagTick {
				l.mu.Lock()
				l.stalled += late
				l.worst = max(l.worst, late)
				l.mu.Unlock()
			}
			want = time.Now().Add(LagTick)
			timer.Reset(LagTick)
		}
	}
}

// Stalled returns the time lost so far (the sum of the counted wakes' lateness) and the worst
// single wake's lateness.
func (l *Lag) Stalled() (total, worst time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stalled, l.worst
}

// Stop ends the probe; it may be called more than once.
func (l *Lag) Stop() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
}
