package worker

import (
	"context"
	"sync/atomic"
)

// runner drains one queue: it fetches jobs, keeps the counts of those in hand, and takes each
// through its life (handle) over its policies. It knows no feature by name.
type runner struct {
	p      *Pool
	name   string
	cfg    atomic.Pointer[QueueConfig]
	cancel context.CancelFunc
	// inHand counts the jobs in hand; settling, those whose place was freed while their plan
	// is carried out (handle); slotWaiters, those in hand waiting for their leak slot, and
	// slotUnits their units (Job.Cost, at least 1).
	inHand      atomic.Int64
	settling    atomic.Int64
	slotWaiters atomic.Int64
	slotUnits   atomic.Int64
	pol         policies   // in admission order (newRunner)
	fs          fetchState // the fetch loop's own state
	memo        recallMemo // what recall knows across jobs
	// wake is signalled when a job was finished, the last slot waiter got its slot, or the
	// config changed; changed is closed (and replaced) when the config changes.
	wake    chan struct{}
	changed atomic.Pointer[chan struct{}]
	// fetching is set once the runner has its queue's consumer: a job published from then on
	// reaches its fetch (Pool.Ready).
	fetching atomic.Bool
	// shared: its queue is of a shared stream, run on demand; rang: a bell rang for it since
	// its last long pull began (shared.go).
	shared bool
	rang   atomic.Bool
	// pullCut cuts the long pull the runner waits in, if any (former.go).
	pullCut atomic.Pointer[context.CancelFunc]
}

// fetchState is the fetch loop's state of a runner; only that loop uses it.
type fetchState struct {
	lv       *levels // its queue's priority levels, once looked up (fetch)
	idle     bool    // the last long pull expired empty
	lastCost int64   // the cost of the last job fetched (fairLookahead's estimate of the next)
	formers  formerState
}

// reconfigured tells the runner's loops that its config changed.
func (r *runner) reconfigured() {
	ch := make(chan struct{})
	if old := r.changed.Swap(&ch); old != nil {
		close(*old)
	}
}

// untilChanged waits until the runner's config changes or ctx ends, and reports whether ctx
// lasts: the loops of features a queue does not use wait here instead of ticking, so an idle
// queue costs its worker no wake-ups.
func (r *runner) untilChanged(ctx context.Context) bool {
	select {
	case <-*r.changed.Load():
		return true
	case <-ctx.Done():
		return false
	}
}

func (r *runner) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}
