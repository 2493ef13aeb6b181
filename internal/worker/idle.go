package worker

import (
	"context"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/retry"
)

// Idle queues. A runner whose queue has nothing waiting makes one pull request that the server
// holds for up to idleWait and answers with the first job to arrive, so that an idle queue
// costs each worker one pull request every idleWait instead of two a second, and a job
// published to it still reaches its worker at once. A waiting pull request can be lost with
// the server that held it: on a reconnection to NATS (the server restarted, or the client
// moved to another), or when the queue's consumer elects a new leader in a cluster. The pool
// watches for both and cuts every waiting pull short (pulls), and the runners pull again.
//
// Cutting a pull short (and shutting down) unsubscribes its inbox; the server checks that a
// waiting request still has interest before it sends a job to it, so only a job sent in the
// instant before waits for its AckWait. Rejected, in docs/design/worker.md: a core NATS
// subscription per idle queue to wake its runner (it would carry every job's payload twice,
// and sees no redelivery of a job a worker handed back or lost), and one consumer per worker
// over many queues (each queue keeps its own rate, pauses and fairness).

// pulls cuts waiting pull requests short: every long pull is made under the context current
// when it starts, which interrupt cancels (and replaces).
type pulls struct {
	mu     sync.Mutex
	ctx    context.Context
	cancel context.CancelFunc
}

// current returns the context of the pulls starting now.
func (p *pulls) current() context.Context {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx == nil {
		p.ctx, p.cancel = context.WithCancel(context.Background())
	}
	return p.ctx
}

// interrupt cuts every waiting pull short.
func (p *pulls) interrupt() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cancel != nil {
		p.cancel()
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
}

// reconnectPoll is how often the pool looks for a reconnection to NATS.
const reconnectPoll = 250 * time.Millisecond

// watchPulls interrupts the waiting pulls on every reconnection to NATS and every consumer
// leader election, until ctx ends.
func (p *Pool) watchPulls(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		seen := p.q.Reconnects()
		t := time.NewTicker(reconnectPoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if n := p.q.Reconnects(); n != seen {
				seen = n
				p.pulls.interrupt()
			}
		}
	}()
	for ctx.Err() == nil {
		err := p.q.WatchLeaders(ctx, p.pulls.interrupt)
		if ctx.Err() == nil {
			p.log.Warn("worker: watching consumer leader elections; retrying", "err", err)
			retry.Sleep(ctx, nil, watchRetry)
		}
	}
}
