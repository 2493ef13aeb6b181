package leaky

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"
)

// BatchTaker is a Schedule that reserves several consecutive slots of a queue in one call:
// Redis in one script and one round trip, Memory under one lock.
type BatchTaker interface {
	Schedule
	// TakeN reserves the queue's next n slots at rate r, in order: what n Takes right after
	// each other would reserve.
	TakeN(ctx context.Context, queue string, r Rate, n int) ([]Slot, error)
}

// MaxBatch is the most slots a Coalesce schedule reserves in one call.
const MaxBatch = 64

// Coalesce returns s with the Takes of one queue that overlap in time served by shared calls
// of TakeN: a Take that finds another in flight waits for the call after it, which reserves
// slots for every Take that arrived meanwhile (up to MaxBatch). A lone Take costs what it
// costs on s, plus a goroutine hand-off; at thousands of slots a second, one round trip
// serves several (about 3 in a 4-worker drain of 10 000 jobs a second). The slots are exactly those s would reserve one Take at a time: the
// batch reserves one per waiting caller, none ahead of demand. A caller whose ctx ends after
// its slot was reserved leaves that slot unused, as WaitHooks does with a slot given up.
//
// Pause, PausedFor and the check of a slot before it (Redis) go to s unchanged. When s is not
// a BatchTaker, Coalesce returns s.
func Coalesce(s Schedule) Schedule {
	bt, ok := s.(BatchTaker)
	if !ok {
		return s
	}
	c := &coalesced{BatchTaker: bt, lines: map[string]*takeLine{}}
	if ck, ok := s.(checker); ok {
		return &coalescedChecker{coalesced: c, ck: ck}
	}
	return c
}

type coalesced struct {
	BatchTaker
	mu    sync.Mutex
	lines map[string]*takeLine // queue → its waiting Takes; guarded by mu
}

// takeLine is one queue's Takes waiting for a call, and whether a goroutine is sending them.
type takeLine struct {
	waiting []*takeReq
	sending bool
}

type takeReq struct {
	ctx  context.Context
	rate Rate
	done chan takeRes // buffered: the sender never blocks on a caller that left
}

type takeRes struct {
	slot Slot
	err  error
}

// Take reserves the queue's next slot, in a call shared with the Takes of the queue that
// overlap it; see Coalesce.
func (c *coalesced) Take(ctx context.Context, queue string, r Rate) (Slot, error) {
	if err := ctx.Err(); err != nil {
		return Slot{}, err
	}
	req := &takeReq{ctx: ctx, rate: r, done: make(chan takeRes, 1)}
	c.mu.Lock()
	l := c.lines[queue]
	if l == nil {
		l = &takeLine{}
		c.lines[queue] = l
	}
	l.waiting = append(l.waiting, req)
	if !l.sending {
		l.sending = true
		go c.send(queue, l)
	}
	c.mu.Unlock()
	select {
	case res := <-req.done:
		return res.slot, res.err
	case <-ctx.Done():
		c.mu.Lock()
		for i, w := range l.waiting {
			if w == req {
				l.waiting = append(l.waiting[:i], l.waiting[i+1:]...)
				break
			}
		}
		c.mu.Unlock()
		return Slot{}, ctx.Err()
	}
}

// send takes the line's waiting Takes, a batch of one rate at a time, and serves each batch
// with one TakeN, until none waits.
func (c *coalesced) send(queue string, l *takeLine) {
	// Takes woken by one event (a runner's turns, whose timers end together) are runnable now:
	// let them join the first call rather than wait a round trip for the second.
	runtime.Gosched()
	for {
		c.mu.Lock()
		n := 0
		for n < len(l.waiting) && n < MaxBatch && l.waiting[n].rate == l.waiting[0].rate {
			n++
		}
		if n == 0 {
			l.sending = false
			delete(c.lines, queue)
			c.mu.Unlock()
			return
		}
		batch := make([]*takeReq, n)
		copy(batch, l.waiting)
		l.waiting = append(l.waiting[:0], l.waiting[n:]...)
		c.mu.Unlock()

		slots, err := c.takeFor(queue, batch)
		for i, req := range batch {
			if err != nil {
				req.done <- takeRes{err: err}
				continue
			}
			req.done <- takeRes{slot: slots[i]}
		}
	}
}

// takeFor reserves the slots of batch, whose Takes share a rate, in one TakeN. The call
// outlives a caller that leaves (its slot is then unused) but keeps the deadline of the
// batch's first.
func (c *coalesced) takeFor(queue string, batch []*takeReq) ([]Slot, error) {
	ctx := context.WithoutCancel(batch[0].ctx)
	if dl, ok := batch[0].ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl)
		defer cancel()
	}
	slots, err := c.TakeN(ctx, queue, batch[0].rate, len(batch))
	if err == nil && len(slots) != len(batch) {
		err = fmt.Errorf("leaky: take %q: %d slots for %d", queue, len(slots), len(batch))
	}
	return slots, err
}

// coalescedChecker is a coalesced schedule whose slots are checked before they come (Redis).
type coalescedChecker struct {
	*coalesced
	ck checker
}

func (c *coalescedChecker) check(ctx context.Context, queue string, s Slot) (time.Duration, bool, Slot, error) {
	return c.ck.check(ctx, queue, s)
}

// TakeN reserves the queue's next n slots at rate rt; see BatchTaker.
func (r *Redis) TakeN(ctx context.Context, queue string, rt Rate, n int) ([]Slot, error) {
	if n < 1 {
		return nil, nil
	}
	interval, _, err := rt.micros()
	if err != nil {
		return nil, err
	}
	args := []any{interval, rt.Burst, n}
	var fixed time.Time
	if r.now != nil {
		fixed = r.now()
		args = append(args, fixed.UnixMicro())
	}
	sent := time.Now()
	res, err := takeScript.Run(ctx, r.rdb, []string{r.key(queue)}, args...).Int64Slice()
	recv := time.Now()
	if err != nil {
		return nil, fmt.Errorf("leaky: take %q: %w", queue, err)
	}
	if len(res) != 3+n {
		return nil, fmt.Errorf("leaky: take %q: unexpected reply %v", queue, res)
	}
	now, epoch := res[0], res[1]
	var c *serverClock
	var lo, hi int64
	var young bool
	if r.now == nil {
		c = r.clock(queue)
		lo, hi, young = c.observe(sent, recv, now)
		r.seen(queue).saw(sent, now, epoch, res[2])
	}
	slots := make([]Slot, n)
	for i, w := range res[3:] {
		if w < 0 {
			return nil, fmt.Errorf("leaky: take %q: unexpected reply %v", queue, res)
		}
		wait, sched := time.Duration(w)*time.Microsecond, now+w
		if c == nil {
			slots[i] = Slot{Wait: wait, At: fixed.Add(wait), sched: sched, epoch: epoch}
			continue
		}
		slots[i] = Slot{Wait: wait, At: c.local(sched, hi), early: c.local(sched, lo), strict: young, sched: sched, epoch: epoch}
	}
	return slots, nil
}

// TakeN reserves the queue's next n slots at rate r; see BatchTaker. It never returns an
// error other than ErrInvalidRate.
func (m *Memory) TakeN(ctx context.Context, queue string, r Rate, n int) ([]Slot, error) {
	slots := make([]Slot, 0, n)
	for range n {
		s, err := m.Take(ctx, queue, r)
		if err != nil {
			return nil, err
		}
		slots = append(slots, s)
	}
	return slots, nil
}

var (
	_ BatchTaker = (*Redis)(nil)
	_ BatchTaker = (*Memory)(nil)
)
