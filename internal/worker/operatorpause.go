package worker

import (
	"context"
	"time"

	"github.com/sluice-rl/sluice/retry"
)

// pausePoll is how often a worker looks whether an operator's pause of its queue has ended (the
// controls themselves arrive by a watch, at once).
const pausePoll = 100 * time.Millisecond

// operatorPause is the policy of an operator's pause of the queue (queue.Control): while it
// lasts, no job takes a place or a slot. It waits in the worker rather than handing jobs back,
// as an operator's pause may have no end. The leak slot checks it again just before each slot
// (pausedNow), so a pause that starts while a job waits for its slot holds that job too.
type operatorPause struct {
	env queueEnv
}

// pausedNow reports whether an operator has paused the queue now.
func (p *operatorPause) pausedNow() bool { return p.env.control().PausedAt(p.env.now()) }

// admit waits while the queue is paused; the pass ends, not sent, when ctx ends first.
func (p *operatorPause) admit(ctx context.Context, _ *QueueConfig, _ *job) verdict {
	if waitResumed(ctx, p.pausedNow) != nil {
		return refuse(endNotSent, "stopped while paused")
	}
	return pass()
}

// waitResumed waits while paused reports true, looking every pausePoll; it returns ctx's error
// when ctx ends first.
func waitResumed(ctx context.Context, paused func() bool) error {
	for paused() {
		if err := retry.Sleep(ctx, nil, pausePoll); err != nil {
			return err
		}
	}
	return ctx.Err()
}
