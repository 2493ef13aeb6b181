package fair

import "github.com/sluice-rl/sluice/queue"

// starveAfter is the starvation guard within a tenant's share, as the workers' on a queue
// that is not fair: while a lower level of the tenant has waiting jobs, at least one of every
// starveAfter of the tenant's jobs moved from that level and the ones above it is of it.
const starveAfter = 8

// levels orders one tenant's jobs by priority within the share the picker gives it: high
// before normal before low, under the starvation guard. It does no I/O. The zero value is a
// tenant with no waiting jobs. It is not safe for concurrent use.
type levels struct {
	// depth is the waiting jobs per level (in the order of queue.Priorities), as last read, less those taken
	// since.
	depth queue.Levels
	// read is the waiting jobs per level of the last reading, as it was.
	read queue.Levels
	// since counts, for normal and low, the jobs taken from higher levels since the level
	// last gave one or was seen empty.
	since [3]int
}

// set takes the depths of a new reading; the guard's counts are kept.
func (l *levels) set(d queue.Levels) {
	l.depth, l.read = d, d
	for i, n := range d {
		if n == 0 {
			l.since[i] = 0
		}
	}
}

// take chooses n of the tenant's jobs and returns how many of each level, fewer in all when
// fewer wait.
func (l *levels) take(n int) [3]int {
	var out [3]int
	for ; n > 0; n-- {
		i := l.next()
		if i < 0 {
			break
		}
		out[i]++
		l.depth[i]--
		l.since[i] = 0
		for lower := i + 1; lower < len(l.depth); lower++ {
			if l.depth[lower] > 0 {
				l.since[lower]++
			} else {
				l.since[lower] = 0
			}
		}
	}
	return out
}

// next is the level of the tenant's next job, -1 if none waits: the highest with jobs that no
// waiting lower level's guard holds back.
func (l *levels) next() int {
	for i := range l.depth {
		if l.depth[i] == 0 {
			continue
		}
		held := false
		for lower := i + 1; lower < len(l.depth); lower++ {
			if l.depth[lower] > 0 && l.since[lower] >= starveAfter-1 {
				held = true
			}
		}
		if !held {
			return i
		}
	}
	return -1
}

// empty records that level i turned out to have no more jobs than were moved.
func (l *levels) empty(i int) {
	l.depth[i], l.since[i] = 0, 0
}

// single reports, for split, what take returned when the depth was before, whether it is one
// job that was alone at its level in the last reading, none of the level's taken since, and
// which level: the job is then the level's only one at or below the reading's last sequence
// (FairLayout.LevelDepths), whichever jobs arrived since.
func (l *levels) single(before queue.Levels, split [3]int) (int, bool) {
	at := -1
	for i, n := range split {
		switch {
		case n == 0:
		case n == 1 && at < 0:
			at = i
		default:
			return -1, false
		}
	}
	if at < 0 || l.read[at] != 1 || before[at] != 1 {
		return -1, false
	}
	return at, true
}
