package worker

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Ready reports whether the Pool can deliver a job of every queue it drains: nil once each
// queue's runner has its consumer (its first fetch follows at once), and while its leak
// schedule answers. Otherwise an error: one wrapping ErrScheduleDown while the leak schedule
// (Redis) cannot be reached, saying since when and why — the Pool then hands back the jobs it
// holds and fetches none, so that workers that can reach the schedule deliver them, and
// resumes by itself once it answers — or one naming the queues whose consumer it still waits
// for, or saying that the doorbell of the shared queues is not subscribed yet (shared.go: their
// runners start on demand and do not count). Before Run it has no runner, and reports nil.
func (p *Pool) Ready() error {
	if err := p.health.err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var waiting []string
	for name, r := range p.runners {
		if !r.fetching.Load() && !r.shared {
			waiting = append(waiting, name)
		}
	}
	if p.bells != nil && p.ctx != nil && !p.swept.done() {
		return errors.New("the first look for queues that hold jobs in their former streams has not ended yet")
	}
	if len(p.shared) > 0 && !p.bellOn.Load() {
		return fmt.Errorf("the doorbell of %d shared queues is not subscribed yet, or its first look for queues that hold jobs failed", len(p.shared))
	}
	if len(waiting) == 0 {
		return nil
	}
	slices.Sort(waiting)
	return fmt.Errorf("%d of %d queues not fetching yet, their consumer not found: %s",
		len(waiting), len(p.runners), quoteSome(waiting, 5))
}

// quoteSome is up to n of names, quoted, and how many more there are.
func quoteSome(names []string, n int) string {
	q := make([]string, 0, min(n, len(names)))
	for _, name := range names[:min(n, len(names))] {
		q = append(q, fmt.Sprintf("%q", name))
	}
	s := strings.Join(q, ", ")
	if len(names) > n {
		s += fmt.Sprintf(" and %d more", len(names)-n)
	}
	return s
}

// Started returns a channel that is closed once every runner of the Pool has its queue's
// consumer: from then on Ready reports nil unless the leak schedule is down. A process
// reports itself ready on it.
func (p *Pool) Started() <-chan struct{} { return p.started.ch() }

// startSignal is closed once, lazily made.
type startSignal struct {
	once, closed sync.Once
	c            chan struct{}
}

func (s *startSignal) ch() chan struct{} {
	s.once.Do(func() { s.c = make(chan struct{}) })
	return s.c
}

func (s *startSignal) close() { s.closed.Do(func() { close(s.ch()) }) }

// done reports whether s was closed.
func (s *startSignal) done() bool {
	select {
	case <-s.ch():
		return true
	default:
		return false
	}
}

// checkStarted closes p.started when every runner has its consumer.
func (p *Pool) checkStarted() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.checkStartedLocked()
}

func (p *Pool) checkStartedLocked() {
	if p.ctx == nil { // not running (yet, or any more)
		return
	}
	for _, r := range p.runners {
		if !r.fetching.Load() && !r.shared {
			return
		}
	}
	if len(p.shared) > 0 && !p.bellOn.Load() {
		return
	}
	if p.bells != nil && !p.swept.done() {
		return
	}
	p.started.close()
}
