package inflight

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// An acquire whose call failed without an answer from Redis (a timeout, a broken connection,
// a ctx that ended mid-call) may still run on the server: a stalled redis-server (SIGSTOP, a
// long fork, an overloaded host) runs the scripts it had received when it resumes, and would
// grant a place that nobody holds for its whole hold, costing the cap that place long after
// the stall. So the store voids such a lease in the background: it releases it (a no-op when
// the script never ran) until two releases have succeeded one after the other, the second sent
// once Redis had answered the first, so after any command that was waiting on a connection
// when it resumed; or until the hold has passed (the place is gone by then), Close, or its
// Redis client is closed. It costs two small scripts per acquire that failed that way, and
// nothing otherwise.

// voidTries is the backoff between a void's releases: from voidFirst, doubled, to voidMax.
const (
	voidFirst = 10 * time.Millisecond
	voidMax   = 200 * time.Millisecond
	// voidCall bounds one release of a void.
	voidCall = time.Second
)

// answered reports whether err is an answer of Redis (the script ran, or was refused as a
// whole), not a failure to get one.
func answered(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// void releases lease, whose acquire failed with err, in the background when err says Redis
// may run it still; hold is the hold the acquire asked for, from start.
func (r *Redis) void(lease Lease, start time.Time, hold time.Duration, err error) {
	if answered(err) || errors.Is(err, ErrCrossSlot) {
		return
	}
	r.voids.Add(1)
	go func() {
		defer r.voids.Done()
		ctx, cancel := context.WithDeadline(r.stopVoids, start.Add(hold))
		defer cancel()
		delay, ok := voidFirst, 0
		for ok < 2 {
			cctx, ccancel := context.WithTimeout(ctx, voidCall)
			err := r.Release(cctx, lease)
			ccancel()
			if err == nil {
				ok++
				continue
			}
			if errors.Is(err, redis.ErrClosed) {
				return // its client is closed: nothing can be released, nor granted, through it
			}
			ok = 0
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, voidMax)
		}
	}()
}
