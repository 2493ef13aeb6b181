package worker

import (
	"context"
	"math"
	"time"

	"github.com/sluice-rl/sluice/queue"
)

// Priorities: a runner takes a queue's high jobs before its normal ones before its low ones
// (queue.Priorities), with a starvation guard: while a lower level has jobs, at least one of
// every starveAfter jobs the runner takes is of that level. A level found empty is asked
// again only after levelProbe, so a queue that uses no priorities costs two requests per
// levelProbe more, not one per fetch; a job of such a level waits up to levelProbe longer.

// levelSource gives a runner the consumers of its queue's priority levels (queue.Deliveries).
type levelSource interface {
	LevelConsumer(ctx context.Context, name string, p queue.Priority) (*queue.Consumer, error)
}

const (
	// starveAfter: a waiting lower level gets at least one of every starveAfter jobs a runner
	// takes.
	starveAfter = 8
	// levelProbe is how long a level found empty is left alone (high and low; normal is
	// always asked, as before priorities).
	levelProbe = 250 * time.Millisecond
)

// levels is a runner's state of its queue's priority levels, indexed as queue.Priorities
// (0 high, 1 normal, 2 low). Only the runner's fetch loop uses it.
type levels struct {
	cons [3]consumer
	// idleUntil is when a level found empty is asked again.
	idleUntil [3]time.Time
	// taken counts, for normal and low, the jobs taken from higher levels since the level
	// last gave a job or was found empty.
	taken [3]int
}

// levelsOf returns the runner's levels with cons as the normal one, nil when the broker has
// no levels; it looks the other consumers up once.
func (r *runner) levelsOf(ctx context.Context, cons consumer) *levels {
	if cfg := r.cfg.Load(); !cfg.Priorities || cfg.Fair {
		r.fs.lv = nil
		return nil
	}
	if r.fs.lv != nil {
		return r.fs.lv
	}
	lv := &levels{}
	lv.cons[1] = cons
	for i, p := range queue.Priorities {
		if p == queue.PriorityNormal {
			continue
		}
		c, err := r.p.consumer(ctx, r.name, p)
		if err != nil {
			return nil // not provisioned yet: normal jobs only, and try again next time
		}
		lv.cons[i] = c
	}
	r.fs.lv = lv
	return lv
}

// asked reports whether level i is to be asked now.
func (lv *levels) asked(i int, now time.Time) bool { return !now.Before(lv.idleUntil[i]) }

// room is how many jobs level i may give now before a lower level that waits must have its
// turn (the starvation guard).
func (lv *levels) room(i int, now time.Time) int {
	room := math.MaxInt
	for lower := i + 1; lower < len(lv.cons); lower++ {
		if lv.asked(lower, now) {
			room = min(room, starveAfter-1-lv.taken[lower])
		}
	}
	return room
}

// take returns up to n jobs available now, the highest level's first within the guard.
func (lv *levels) take(ctx context.Context, n int, now time.Time) ([]*queue.Msg, error) {
	var out []*queue.Msg
	held := true
	for pass := 0; pass < 2 && held && len(out) < n; pass++ {
		// The second pass is for the levels the guard held back while a lower one, asked in
		// the first, turned out empty.
		held = false
		for i := range lv.cons {
			if !lv.asked(i, now) || len(out) == n {
				continue
			}
			want := min(n-len(out), lv.room(i, now))
			if want <= 0 {
				held = true
				continue
			}
			msgs, err := lv.cons[i].Fetch(ctx, want, 0)
			if err != nil {
				return out, err
			}
			lv.note(i, len(msgs), now)
			out = append(out, msgs...)
		}
	}
	return out, nil
}

// note records that level i gave k jobs.
func (lv *levels) note(i, k int, now time.Time) {
	lv.taken[i] = 0
	if k == 0 {
		if i != 1 {
			lv.idleUntil[i] = now.Add(levelProbe)
		}
		return
	}
	for lower := i + 1; lower < len(lv.cons); lower++ {
		lv.taken[lower] += k
	}
}

// wait makes one long pull on every level at once and returns the jobs of whichever answer
// first; the first answer cancels the other pulls (cancel), and any job they had already got
// is returned as well. An idle queue so costs a pull per level per idleWait.
func (lv *levels) wait(ctx context.Context, cancel context.CancelFunc, idle time.Duration) ([]*queue.Msg, error) {
	type result struct {
		msgs []*queue.Msg
		err  error
	}
	results := make(chan result, len(lv.cons))
	for _, c := range lv.cons {
		go func() {
			msgs, err := c.Fetch(ctx, 1, idle)
			if len(msgs) > 0 {
				cancel()
			}
			results <- result{msgs, err}
		}()
	}
	var out []*queue.Msg
	var firstErr error
	for range lv.cons {
		r := <-results
		out = append(out, r.msgs...)
		if r.err != nil && firstErr == nil {
			firstErr = r.err
		}
	}
	if len(out) > 0 {
		clear(lv.idleUntil[:]) // a job came: ask every level again
		return out, nil
	}
	return nil, firstErr
}
