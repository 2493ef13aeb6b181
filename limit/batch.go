package limit

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A batcher coalesces the scripts of concurrent calls into shared pipelines (auto-pipelining,
// as rueidis does), so that under load one round trip to Redis carries many decisions instead
// of one. It starts no goroutine: callers send the pipelines themselves (leader/follower).
//
// A call that finds fewer than maxFlight pipelines in flight sends its scripts at once, on its
// own goroutine and with its own context, exactly as an unbatched call would: nothing waits
// for a timer or for company. A call that finds every pipeline busy joins the queue. When a
// pipeline's replies are in, the call that sent it hands them to the calls that rode along,
// takes the queue (up to maxBatch scripts) and wakes one of those calls to send them as the
// next pipeline; then it returns its own decision. So each round trip carries the calls that
// arrived during the previous one, and a call that sends a pipeline returns as soon as that
// pipeline is back.
//
// The scripts of one call always travel in one pipeline. Each script still runs atomically in
// Redis: batching shares the network round trip, not the decision.
//
// Contexts. A queued call waits for its replies or for its context, whichever comes first. A
// call whose context ends while it is queued is taken out of the queue and never charged; one
// whose scripts were already sent by another call returns ctx.Err() at once, but its scripts
// may still run, as with a timed-out EVALSHA. The sender of a shared pipeline is the call with
// the latest deadline of the batch, and the pipeline runs under that deadline but not under
// its cancellation, so no caller's context ends the others' decisions early; the sender itself
// returns when go-redis does, as an unbatched call would.
type batcher struct {
	rdb       RedisClient
	maxBatch  int // decisions per pipeline; a call with more is sent alone
	maxFlight int // pipelines in flight at once
	maxQueue  int // decisions waiting; a call that does not fit waits for room

	mu     sync.Mutex
	flying int           // pipelines in flight, or handed to a call that is to send them
	queue  []*op         // calls waiting for a pipeline; non-empty only when flying == maxFlight
	queued int           // decisions in queue
	room   chan struct{} // closed when the queue shrinks; nil while no call waits for room
}

// op is one call's scripts on their way through a batcher.
type op struct {
	cmds []*redis.Cmd // EVALSHAs of this package's scripts
	// decisions is how many decisions cmds make (a run of multi.lua makes several); 0: one
	// per command. A batch's size is counted in decisions.
	decisions int
	one       [1]*redis.Cmd   // cmds of a Decide
	self      [1]*op          // the batch of a call that sends alone
	stop      <-chan struct{} // the caller's ctx.Done()
	deadline  time.Time       // the caller's deadline; zero when it has none
	state     opState         // guarded by batcher.mu
	// done receives once: when cmds hold their replies (sent is true), when the call was
	// dropped unsent because its context had ended (sent is false), or when the call is to
	// send the batch lead, which holds it. Each is written before the send on done.
	done chan struct{}
	sent bool
	lead []*op
}

// size is how many decisions o makes: what maxBatch and maxQueue count.
func (o *op) size() int {
	if o.decisions > 0 {
		return o.decisions
	}
	return len(o.cmds)
}

type opState uint8

const (
	opNew    opState = iota
	opQueued         // in batcher.queue
	opTaken          // taken out of the queue by a sender
)

// do sends o's scripts, alone or in a shared pipeline, and waits for their replies. It returns
// ctx.Err() when ctx ends first; o.cmds are then not to be read.
func (b *batcher) do(ctx context.Context, o *op) error {
	o.stop = ctx.Done()
	o.deadline, _ = ctx.Deadline()
	o.done = make(chan struct{}, 1)
	n := o.size()
	for {
		b.mu.Lock()
		if b.flying < b.maxFlight {
			b.flying++
			o.state = opTaken
			b.mu.Unlock()
			o.self[0] = o
			b.lead(ctx, o, o.self[:])
			return nil
		}
		if b.queued == 0 || b.queued+n <= b.maxQueue {
			b.queue = append(b.queue, o)
			b.queued += n
			o.state = opQueued
			b.mu.Unlock()
			break
		}
		// The queue is full: wait until a sender takes some of it.
		if b.room == nil {
			b.room = make(chan struct{})
		}
		room := b.room
		b.mu.Unlock()
		select {
		case <-room:
		case <-o.stop:
			return ctx.Err()
		}
	}

	select {
	case <-o.done:
		if o.lead != nil {
			select {
			case <-o.stop: // ended just now: let another call send
			default:
				b.lead(ctx, o, o.lead)
				return nil
			}
		}
	case <-o.stop:
		b.mu.Lock()
		if o.state == opQueued {
			b.remove(o)
			b.mu.Unlock()
			return ctx.Err()
		}
		select {
		case <-o.done: // received under b.mu, so a call chosen to send cannot be missed
		default:
			b.mu.Unlock()
			return ctx.Err() // on its way in another call's pipeline
		}
		b.mu.Unlock()
	}
	if o.lead != nil {
		b.mu.Lock()
		b.promote(slices.DeleteFunc(o.lead, func(m *op) bool { return m == o }))
		b.mu.Unlock()
		return ctx.Err()
	}
	if !o.sent {
		return ctx.Err()
	}
	return nil
}

// lead sends batch, which holds o, as o's caller; hands the replies to the other calls of
// batch; and passes its place in flight on to the calls queued meanwhile.
func (b *batcher) lead(ctx context.Context, o *op, batch []*op) {
	if len(batch) > 1 {
		// o has the latest deadline of batch: run under it, but not under o's cancellation.
		ctx = context.WithoutCancel(ctx)
		if !o.deadline.IsZero() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, o.deadline)
			defer cancel()
		}
	}
	b.send(ctx, batch)
	for _, m := range batch {
		if m != o {
			m.done <- struct{}{} // buffered: never blocks, even when the caller gave up
		}
	}
	b.mu.Lock()
	b.promote(b.take())
	b.mu.Unlock()
}

// promote hands batch to one of its calls to send, the one with the latest deadline; calls
// whose context has ended are dropped unsent. When no call is left, it takes the next batch
// from the queue, and when the queue is empty, the place in flight is free. b.mu is held.
func (b *batcher) promote(batch []*op) {
	for {
		var next *op
		live := batch[:0]
		for _, m := range batch {
			select {
			case <-m.stop:
				m.done <- struct{}{} // m.sent is false
				continue
			default:
			}
			live = append(live, m)
			if next == nil || later(m.deadline, next.deadline) {
				next = m
			}
		}
		if next != nil {
			next.lead = live
			next.done <- struct{}{}
			return
		}
		if batch = b.take(); len(batch) == 0 {
			b.flying--
			return
		}
	}
}

// later reports whether deadline a is later than b; zero is no deadline, the latest of all.
func later(a, b time.Time) bool {
	return !b.IsZero() && (a.IsZero() || a.After(b))
}

// take takes up to maxBatch scripts' worth of calls from the front of the queue, at least one
// call if any is queued. b.mu is held.
func (b *batcher) take() []*op {
	n, i := 0, 0
	for ; i < len(b.queue); i++ {
		c := b.queue[i].size()
		if i > 0 && n+c > b.maxBatch {
			break
		}
		n += c
	}
	if i == 0 {
		return nil
	}
	batch := slices.Clone(b.queue[:i])
	for _, m := range batch {
		m.state = opTaken
	}
	rest := copy(b.queue, b.queue[i:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	b.queued -= n
	b.wake()
	return batch
}

// remove takes o, whose caller gave up, out of the queue. b.mu is held.
func (b *batcher) remove(o *op) {
	if i := slices.Index(b.queue, o); i >= 0 {
		b.queue = slices.Delete(b.queue, i, i+1)
		b.queued -= o.size()
		b.wake()
	}
}

// wake lets the calls waiting for room in the queue try again. b.mu is held.
func (b *batcher) wake() {
	if b.room != nil {
		close(b.room)
		b.room = nil
	}
}

// send runs the scripts of batch in one pipeline (two when the server had to be sent scripts
// it did not know).
func (b *batcher) send(ctx context.Context, batch []*op) {
	pipe := b.rdb.Pipeline()
	for _, o := range batch {
		o.sent = true
		for _, c := range o.cmds {
			_ = pipe.Process(ctx, c)
		}
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error

	// A script the server did not know did not run; send those again with EVAL.
	var again redis.Pipeliner
	for _, o := range batch {
		for i, c := range o.cmds {
			if noScript(c.Err()) {
				if again == nil {
					again = b.rdb.Pipeline()
				}
				o.cmds[i] = evalCmd(c)
				_ = again.Process(ctx, o.cmds[i])
			}
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
	}
}

// evalCmd returns the EVAL of the script that the EVALSHA c asked for.
func evalCmd(c *redis.Cmd) *redis.Cmd {
	args := slices.Clone(c.Args())
	for a := range numAlgos {
		switch args[1] {
		case scripts[a].Hash():
			args[0], args[1] = "eval", sources[a]
		case adjustScripts[a].Hash():
			args[0], args[1] = "eval", adjustSources[a]
		}
	}
	if args[1] == multiSHA {
		args[0], args[1] = "eval", multiSource
	}
	return redis.NewCmd(context.Background(), args...)
}
