package inflight

import (
	"context"
	"slices"
	"sync"
	"time"
)

// DefaultRecheck is how long a Redis waiter waits at most for a notification before it tries
// again: a release whose message was lost (a subscription reconnecting) delays it that long.
const DefaultRecheck = 250 * time.Millisecond

// waiters are the Waits of one store, by key, in the order they came: a release of a key
// wakes its longest waiter not already woken, which then tries to acquire again. Waking one,
// not all, keeps a release to an attempt or so per process however many jobs wait (256 jobs
// on a cap of 8 in two processes: 32 round trips per place when every waiter woke, 5 now;
// BENCHMARKS.md). Its methods are safe for concurrent use.
type waiters struct {
	mu     sync.Mutex
	byKey  map[string][]*waiter
	closed bool
}

// waiter is one blocked Wait. wake has room for one notification: more while it is awake add
// nothing, since its next attempt sees every release before it.
type waiter struct {
	keys []string
	wake chan struct{}
}

// add registers a waiter on keys; it is called before the first attempt, so that no release
// between an attempt and the wait is missed. It returns nil once the store is closed.
func (ws *waiters) add(keys []string) *waiter {
	w := &waiter{keys: keys, wake: make(chan struct{}, 1)}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.closed {
		return nil
	}
	if ws.byKey == nil {
		ws.byKey = make(map[string][]*waiter)
	}
	for _, k := range keys {
		ws.byKey[k] = append(ws.byKey[k], w)
	}
	return w
}

// remove unregisters w. A wake w had not yet taken (its Wait ended first) goes to the next
// waiter of each of its keys, so that a freed place is not left to the re-check.
func (ws *waiters) remove(w *waiter) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, k := range w.keys {
		list := ws.byKey[k]
		for i, o := range list {
			if o == w {
				list = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(ws.byKey, k)
		} else {
			ws.byKey[k] = list
		}
	}
	if len(w.wake) > 0 {
		for _, k := range w.keys {
			ws.wakeAfterLocked(k, nil)
		}
	}
}

// wakeKey wakes the longest waiter of key not already woken.
func (ws *waiters) wakeKey(key string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.wakeAfterLocked(key, nil)
}

// wakeAfterLocked wakes the first waiter of key not already woken that came after after (nil:
// from the first).
func (ws *waiters) wakeAfterLocked(key string, after *waiter) {
	list := ws.byKey[key]
	if after != nil {
		i := slices.Index(list, after)
		if i < 0 {
			return
		}
		list = list[i+1:]
	}
	for _, w := range list {
		if len(w.wake) == 0 {
			w.signal()
			return
		}
	}
}

// any reports whether a waiter is registered (for the subscription to skip parsing).
func (ws *waiters) any() bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return len(ws.byKey) > 0
}

// close wakes every waiter and makes add refuse new ones.
func (ws *waiters) close() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.closed = true
	for _, list := range ws.byKey {
		for _, w := range list {
			w.signal()
		}
	}
}

func (ws *waiters) isClosed() bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.closed
}

func (w *waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// passOn wakes, for each key of w that refused attempt res found with room (its cap not
// full), the next waiter after w not yet woken: a place freed under that key is still there,
// and w, refused by another of its caps, cannot use it. A key whose cap is full again passes
// nothing: someone took the place.
func (ws *waiters) passOn(w *waiter, caps []Cap, res Result) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for i, c := range caps {
		if i < len(res.InFlight) && res.InFlight[i] < c.Limit {
			ws.wakeAfterLocked(c.Key, w)
		}
	}
}

// wait is Store.Wait over acquire: it tries, and while refused sleeps until a release of one of
// its caps' keys wakes it, the refusal's RetryAfter passes (at most recheck, when recheck > 0),
// or ctx ends. A waiter woken and refused by one cap passes the wake of the others on (passOn).
func wait(ctx context.Context, ws *waiters, caps []Cap, recheck time.Duration,
	acquire func(context.Context) (Result, error)) (Result, error) {
	w := ws.add(keysOf(caps))
	if w == nil {
		return Result{}, ErrClosed
	}
	defer ws.remove(w)
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for woken := false; ; woken = true {
		res, err := acquire(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return Result{}, ctx.Err()
			}
			return Result{}, err
		}
		if res.Acquired {
			return res, nil
		}
		if woken && len(caps) > 1 {
			ws.passOn(w, caps, res)
		}
		d := res.RetryAfter
		if d <= 0 || recheck > 0 && d > recheck {
			d = recheck
		}
		if d <= 0 {
			d = DefaultRecheck
		}
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-w.wake:
			if ws.isClosed() {
				return Result{}, ErrClosed
			}
		case <-timer.C:
		case <-ctx.Done():
			return Result{}, ctx.Err()
		}
	}
}
