package inflight

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Reuse defaults.
const (
	// DefaultSpare is how much longer than asked a Reuser holds the places it takes, the
	// time during which they can be given again without a round trip.
	DefaultSpare = time.Second
	// DefaultIdle is how long a Reuser keeps a released place for its next taker before it
	// gives it back to the store.
	DefaultIdle = 20 * time.Millisecond
	// giveBackTimeout bounds each background release of a place kept too long; a failed
	// one is tried again after giveBackFirst, doubled up to giveBackMax.
	giveBackTimeout = time.Second
	giveBackFirst   = 10 * time.Millisecond
	giveBackMax     = 200 * time.Millisecond
)

// Reuser is a Store over another that gives a place released by one holder to the next
// holder of the same caps in this process, without a round trip to the store, while nobody
// else may want it: a worker delivering thousands of jobs a second under a cap it does not
// reach pays an Acquire and a Release per place per Spare, not per job.
//
// It takes each place for Spare longer than asked. A released place is kept, not given back,
// when its caps had room after it was taken (none was full: nobody else was likely refused),
// no Wait of this Reuser for the same caps has been in the store for 5 ms (refused there,
// most likely: the place goes back to the store, whose Release wakes it), and it still has at
// least the hold it was taken for ahead of it; the next Acquire or Wait of exactly the same caps (keys and
// limits, so that a changed limit takes places anew) gets it back, with a fresh Result's hold
// still ahead. A place kept unused for Idle goes back to the store. So:
//
//   - A cap is never exceeded: a kept place is still held in the store, and is given to one
//     holder at a time, after the previous one released it.
//   - The store counts a kept place as in flight while it is kept (at most Idle after the
//     last release), and a process that stops without Close leaves its places held for at
//     most Spare longer than the hold asked.
//   - Another process refused a place of a cap a Reuser keeps places of waits at most Spare
//     more for one of them (a kept place is given again only within Spare of its taking), and
//     at most Idle for one kept unused.
//
// Its Result for a kept place has the InFlight counts of the place's taking. InFlight and Renew
// go to the store. It is safe for concurrent use.
type Reuser struct {
	s           Store
	spare, idle time.Duration
	now         func() time.Time

	mu      sync.Mutex
	leases  map[string]*held       // lease id → the lease, while a holder has it
	kept    map[string][]*held     // caps id → released places kept for reuse, oldest first
	waiting map[string][]time.Time // caps id → when each Wait of this Reuser in the store began
	sweep   *time.Timer            // gives back the places kept unused too long; nil when none kept
	closed  bool
	stop    chan struct{} // closed by Close: background releases stop trying again

	bg sync.WaitGroup // places being given back in the background
}

// held is a place a Reuser took.
type held struct {
	lease    Lease
	caps     string        // capsID of its caps
	hold     time.Duration // the hold it was taken for
	expires  time.Time     // when the store frees it, at the latest: its taking's start + hold + spare
	reusable bool          // its caps had room after its taking
	inFlight []int64       // its taking's Result.InFlight
	keptAt   time.Time     // when it was last released into kept
}

// Reuse returns a Reuser over s. A spare or idle of 0 means DefaultSpare, DefaultIdle.
func Reuse(s Store, spare, idle time.Duration) *Reuser {
	if spare <= 0 {
		spare = DefaultSpare
	}
	if idle <= 0 {
		idle = DefaultIdle
	}
	return &Reuser{s: s, spare: spare, idle: idle, now: time.Now,
		leases: map[string]*held{}, kept: map[string][]*held{}, waiting: map[string][]time.Time{},
		stop: make(chan struct{})}
}

// capsID names caps by their keys and limits.
func capsID(caps []Cap) string {
	var b strings.Builder
	for _, c := range caps {
		b.WriteString(strconv.Itoa(len(c.Key)))
		b.WriteByte(':')
		b.WriteString(c.Key)
		b.WriteString(strconv.FormatInt(c.Limit, 10))
		b.WriteByte(';')
	}
	return b.String()
}

// Acquire gives a kept place of caps with hold still ahead, or takes one from the store for
// hold + Spare; see [Store].
func (r *Reuser) Acquire(ctx context.Context, caps []Cap, hold time.Duration) (Result, error) {
	return r.take(ctx, caps, hold, false)
}

// Wait gives a kept place of caps with hold still ahead, or waits for one of the store for
// hold + Spare; see [Store].
func (r *Reuser) Wait(ctx context.Context, caps []Cap, hold time.Duration) (Result, error) {
	return r.take(ctx, caps, hold, true)
}

// take is Acquire, or Wait when wait.
func (r *Reuser) take(ctx context.Context, caps []Cap, hold time.Duration, wait bool) (Result, error) {
	if err := check(caps, hold); err != nil {
		return Result{}, wrap("acquire", err)
	}
	id := capsID(caps)
	if h := r.reuse(id, hold, wait); h != nil { // no round trip
		return Result{Acquired: true, Lease: h.lease, InFlight: h.inFlight}, nil
	}
	start := r.now()
	var res Result
	var err error
	if wait {
		res, err = r.s.Wait(ctx, caps, hold+r.spare)
		r.unwait(id)
	} else {
		res, err = r.s.Acquire(ctx, caps, hold+r.spare)
	}
	if err != nil || !res.Acquired {
		return res, err
	}
	h := &held{lease: res.Lease, caps: id, hold: hold, expires: start.Add(hold + r.spare), reusable: true, inFlight: res.InFlight}
	for i, c := range caps {
		if i >= len(res.InFlight) || res.InFlight[i] >= c.Limit {
			h.reusable = false
		}
	}
	r.mu.Lock()
	r.leases[h.lease.ID] = h
	r.mu.Unlock()
	return res, nil
}

// reuse takes out the latest kept place of caps id if it has hold ahead of it (it goes back
// to the store otherwise). When it finds none for a Wait (wait), the Wait counts as waiting in
// the store from then, in the same critical section, so that a place released while it waits
// there is given back to the store, where it wakes it; take uncounts it.
func (r *Reuser) reuse(id string, hold time.Duration, wait bool) *held {
	r.mu.Lock()
	defer r.mu.Unlock()
	list := r.kept[id]
	if len(list) == 0 {
		if wait {
			r.waiting[id] = append(r.waiting[id], r.now())
		}
		return nil
	}
	now := r.now()
	h := list[len(list)-1]
	list = list[:len(list)-1]
	if len(list) == 0 {
		delete(r.kept, id)
	} else {
		r.kept[id] = list
	}
	if h.expires.Sub(now) < hold {
		r.giveBackLocked(h)
		if wait {
			r.waiting[id] = append(r.waiting[id], now)
		}
		return nil
	}
	r.leases[h.lease.ID] = h
	return h
}

// blocked is how long a Wait has been in the store when it is taken as refused there (an
// attempt is one round trip): a place released then goes back to the store, which wakes it.
const blocked = 5 * time.Millisecond

// blockedLocked reports whether a Wait of caps id has been in the store for blocked.
func (r *Reuser) blockedLocked(id string, now time.Time) bool {
	for _, t := range r.waiting[id] {
		if now.Sub(t) >= blocked {
			return true
		}
	}
	return false
}

// unwait uncounts a Wait of caps id that left the store: the one that came last, which
// may not be the one that left, so that an older Wait still there is not forgotten (at
// worst a place goes back to the store that could have been kept).
func (r *Reuser) unwait(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if list := r.waiting[id]; len(list) > 1 {
		r.waiting[id] = list[:len(list)-1]
	} else {
		delete(r.waiting, id)
	}
}

// Release keeps l's places for the next holder of the same caps when they may be reused (see
// [Reuser]), and gives them back to the store otherwise.
func (r *Reuser) Release(ctx context.Context, l Lease) error {
	r.mu.Lock()
	h := r.leases[l.ID]
	delete(r.leases, l.ID)
	now := r.now()
	if h == nil || r.closed || !h.reusable || r.blockedLocked(h.caps, now) || h.expires.Sub(now) < h.hold {
		r.mu.Unlock()
		return r.s.Release(ctx, l)
	}
	h.keptAt = now
	r.kept[h.caps] = append(r.kept[h.caps], h)
	if r.sweep == nil {
		r.sweep = time.AfterFunc(r.idle, r.sweepIdle)
	}
	r.mu.Unlock()
	return nil
}

// sweepIdle gives back the places kept unused for idle, and runs again while some are kept.
func (r *Reuser) sweepIdle() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sweep = nil
	now := r.now()
	for id, list := range r.kept {
		n := 0
		for _, h := range list { // oldest first
			if now.Sub(h.keptAt) < r.idle {
				break
			}
			r.giveBackLocked(h)
			n++
		}
		if n == len(list) {
			delete(r.kept, id)
		} else {
			r.kept[id] = list[n:]
		}
	}
	if len(r.kept) > 0 && !r.closed {
		r.sweep = time.AfterFunc(r.idle, r.sweepIdle)
	}
}

// giveBackLocked releases h's places in the store, in the background, trying again after a
// failure (a stalled or unreachable Redis) until its places expire or the Reuser is closed:
// a stall costs the cap no longer than the stall and a retry's backoff.
func (r *Reuser) giveBackLocked(h *held) {
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		delay := giveBackFirst
		for {
			ctx, cancel := context.WithTimeout(context.Background(), giveBackTimeout)
			err := r.s.Release(ctx, h.lease)
			cancel()
			if err == nil || !r.now().Add(delay).Before(h.expires) {
				return
			}
			select {
			case <-r.stop:
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, giveBackMax)
		}
	}()
}

// Renew extends l's places in the store (when it is a Renewer); see [Renewer]. A renewed place
// goes back to the store at its release: it was renewed for hold alone, with no Spare on top.
func (r *Reuser) Renew(ctx context.Context, l Lease, hold time.Duration) (bool, error) {
	rn, ok := r.s.(Renewer)
	if !ok {
		return false, nil
	}
	start := r.now()
	renewed, err := rn.Renew(ctx, l, hold)
	r.mu.Lock()
	if h := r.leases[l.ID]; h != nil {
		if renewed {
			h.expires = start.Add(hold) // the store's expiry, at the least; no spare on top
		} else {
			h.reusable = false
		}
	}
	r.mu.Unlock()
	return renewed, err
}

// InFlight reads the places held under each key in the store, kept ones included; see [Store].
func (r *Reuser) InFlight(ctx context.Context, keys ...string) ([]int64, error) {
	return r.s.InFlight(ctx, keys...)
}

// Close gives every kept place back to the store and keeps none from then on; it does not
// close the store. Places still held are given back by their holders' Release.
func (r *Reuser) Close(ctx context.Context) error {
	r.mu.Lock()
	if !r.closed {
		close(r.stop)
	}
	r.closed = true
	if r.sweep != nil {
		r.sweep.Stop()
		r.sweep = nil
	}
	var all []*held
	for _, list := range r.kept {
		all = append(all, list...)
	}
	clear(r.kept)
	r.mu.Unlock()
	defer r.bg.Wait() // the places given back in the background
	var first error
	for _, h := range all {
		if err := r.s.Release(ctx, h.lease); err != nil && first == nil {
			first = err
		}
	}
	return first
}

var (
	_ Store   = (*Reuser)(nil)
	_ Renewer = (*Reuser)(nil)
)
