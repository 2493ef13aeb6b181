package worker

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/sluice-rl/sluice/retry"
)

// dueMover moves a queue's scheduled jobs into it once their time comes; *queue.Queues is
// one (queue.Queues.MoveDue). A Broker that is not one (a test's fake) moves nothing.
type dueMover interface {
	MoveDue(ctx context.Context, name string, max int, wait time.Duration, cut context.Context) (int, error)
}

// moveBatch is how many due jobs one MoveDue call takes at most. It waits for the first up
// to idleWait (the call returns as soon as one is there), cut short as the runner's own long
// pulls are (idle.go): a queue without scheduled jobs costs each worker a pull per idleWait.
const moveBatch = 256

// moveLoop moves the runner's queue's due scheduled jobs into the queue while ctx lasts.
// Every worker process runs one per queue; they share the schedule stream's one consumer.
func (r *runner) moveLoop(ctx context.Context) {
	mv, ok := r.p.q.(dueMover)
	if !ok {
		return
	}
	failures := 0
	for ctx.Err() == nil {
		if _, err := mv.MoveDue(ctx, r.name, moveBatch, idleWait, r.p.pulls.current()); err != nil {
			failures++
			if failures == 1 {
				r.p.log.Warn("worker: move due scheduled jobs", "queue", r.name, "err", err)
			}
			retry.Sleep(ctx, nil, fetchBackoff.Delay(failures, rand.Float64()))
			continue
		}
		failures = 0
	}
}
