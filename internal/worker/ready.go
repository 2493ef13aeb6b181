package worker

import (
	"fmt"
	"slices"
	"strings"
)

// Ready reports whether the Pool can deliver a job of every queue it drains: nil once each
// queue's runner has its consumer (its first fetch follows at once), and while its leak
// schedule answers. Otherwise an error: one wrapping ErrScheduleDown while the leak schedule
// (Redis) cannot be reached, saying since when and why — the Pool then hands back the jobs it
// holds and fetches none, so that workers that can reach the schedule deliver them, and
// resumes by itself once it answers — or one naming the queues whose consumer it still waits
// for. Before Run it has no runner, and reports nil.
func (p *Pool) Ready() error {
	if err := p.health.err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var waiting []string
	for name, r := range p.runners {
		if !r.fetching.Load() {
			waiting = append(waiting, name)
		}
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
