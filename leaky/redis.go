package leaky

import (
	"context"
	_ "embed"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/take.lua
	takeLua    string
	takeScript = redis.NewScript(takeLua)

	//go:embed lua/pause.lua
	pauseLua    string
	pauseScript = redis.NewScript(pauseLua)

	//go:embed lua/paused.lua
	pausedLua    string
	pausedScript = redis.NewScript(pausedLua)

	//go:embed lua/adapt.lua
	adaptLua string
)

// RedisConfig configures a Redis schedule. The zero value is ready to use.
type RedisConfig struct {
	// Prefix is prepended to every key; "" means "sluice:". A queue's state is the hash
	// "{<Prefix>leak:<queue>}".
	Prefix string
	// Now, if set, replaces the Redis server's TIME as the clock of the scripts. For tests only:
	// in production the server's clock is what keeps all hosts on one schedule.
	Now func() time.Time
}

// Redis is a Schedule shared by every process that uses the same Redis and prefix. Each call is
// one round trip running one Lua script (EVALSHA, falling back to EVAL), atomic on the server.
// Slots are instants of the server's clock; a Redis places them on the local clock within the
// shortest round trip its takes of the queue have had (serverClock), so a take whose reply was
// held up still knows when its slot is, and how late it is.
// It needs Redis ≥ 5 (or 3.2 with script effects replication).
//
// A Redis is safe for concurrent use. Its methods return an error wrapping the client's when
// Redis cannot be reached; ctx bounds the call as far as the client honours it (go-redis: dial
// always, reads and writes with ContextTimeoutEnabled, otherwise its ReadTimeout/WriteTimeout).
type Redis struct {
	rdb    redis.Scripter
	prefix string
	now    func() time.Time
	clocks sync.Map // queue → *serverClock
	states sync.Map // queue → *seenState
	// refreshes counts the round trips checks shared (refresh), and joins the checks that
	// waited for one already in flight, for tests.
	refreshes, joins atomic.Int64
}

// NewRedis returns a schedule kept in rdb (a *redis.Client, *redis.ClusterClient, Ring, …).
func NewRedis(rdb redis.Scripter, cfg RedisConfig) *Redis {
	if cfg.Prefix == "" {
		cfg.Prefix = "sluice:"
	}
	return &Redis{rdb: rdb, prefix: cfg.Prefix, now: cfg.Now}
}

// key returns the Redis key holding queue's schedule.
func (r *Redis) key(queue string) string { return "{" + r.prefix + "leak:" + queue + "}" }

// Take reserves the queue's next slot at rate rt; see Schedule. It is TakeN of one.
func (r *Redis) Take(ctx context.Context, queue string, rt Rate) (Slot, error) {
	slots, err := r.TakeN(ctx, queue, rt, 1)
	if err != nil {
		return Slot{}, err
	}
	return slots[0], nil
}

// clock returns the server clock of queue's key: one per queue, as on Redis Cluster queues
// live on different servers.
func (r *Redis) clock(queue string) *serverClock {
	if c, ok := r.clocks.Load(queue); ok {
		return c.(*serverClock)
	}
	c, _ := r.clocks.LoadOrStore(queue, newServerClock())
	return c.(*serverClock)
}

// Pause pauses the queue for d from now; see Schedule.
func (r *Redis) Pause(ctx context.Context, queue string, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	args := []any{ceilMicros(d)}
	if r.now != nil {
		args = append(args, r.now().UnixMicro())
	}
	if err := pauseScript.Run(ctx, r.rdb, []string{r.key(queue)}, args...).Err(); err != nil {
		return fmt.Errorf("leaky: pause %q: %w", queue, err)
	}
	// What this Redis read before the pause answers no check after it.
	r.seen(queue).forget(time.Now())
	return nil
}

// PausedFor reports how long the queue stays paused; see Schedule. It always asks Redis.
func (r *Redis) PausedFor(ctx context.Context, queue string) (time.Duration, error) {
	paused, _, _, err := r.ask(ctx, queue, Slot{})
	return paused, err
}

// check reports PausedFor, whether s was reserved in the queue's current state (always true
// for a Slot without epoch), and s placed again on the local clock: the check runs shortly
// before the slot, usually on a calmer machine than the take, whose round trip may have been
// long (a drain's start sends every worker's takes at once).
//
// The answer comes from the latest state of the queue this Redis read (a take's or a check's
// reply, seenState) when the request that read it was sent less than checkLead ago and the
// queue's clock is no longer young (youngFor). When
// that state is older, the checks of the queue that find it so share one round trip that reads
// it again (refresh): the slots a process lets go together (Grid) check together. While the
// clock is young, or when this process dropped the state meanwhile (its own Pause), a check
// takes a round trip of its own (ask): its sample, on a calmer machine than a loaded start's,
// narrows the clock's bounds for its slot. A slot on a grid (Slot.wide), whose tolerance is
// MinTolerance, is answered from the reading while the clock is young too, placed strictly. Wait checks at most checkLead before the slot, so a slot is used
// only if the queue's state was read at most twice checkLead before it, and not paused then: a pause made by another process stops the slots
// due that long after it, one made by this process every slot it has not yet released.
func (r *Redis) check(ctx context.Context, queue string, s Slot) (time.Duration, bool, Slot, error) {
	if r.now == nil && s.epoch != 0 {
		from := time.Now().Add(-checkLead)
		for read := false; ; read = true {
			if server, epoch, pu, ok := r.seen(queue).since(from); ok {
				c := r.clock(queue)
				// While the clock is young its bounds may still be as wide as a loaded start's
				// round trips: the check's own round trip, on a calmer machine, narrows them.
				// A slot on a grid tolerates MinTolerance: it is placed strictly (lateness from
				// the earliest bound) while the clock is young, as a take's slot is.
				if lo, hi, young, ok := c.bounds(time.Now()); ok && (!young || s.wide) {
					s.At, s.early, s.strict = c.local(s.sched, hi), c.local(s.sched, lo), young
					return time.Duration(max(pu-server, 0)) * time.Microsecond, epoch == s.epoch, s, nil
				}
				break
			}
			if read || (young(r.clock(queue)) && !s.wide) {
				break
			}
			if err := r.refresh(ctx, queue, from); err != nil {
				return 0, false, s, err
			}
		}
	}
	return r.ask(ctx, queue, s)
}

// refresh reads the queue's state into seen, in a round trip sent at or after from: the one in
// flight when it was sent so, otherwise a new one that the refreshes arriving meanwhile share.
// The call outlives a caller that leaves, with the deadline of the one that sent it.
func (r *Redis) refresh(ctx context.Context, queue string, from time.Time) error {
	st := r.seen(queue)
	st.mu.Lock()
	if f := st.reading; f != nil && !f.sent.Before(from) {
		st.mu.Unlock()
		r.joins.Add(1)
		select {
		case <-f.done:
			return f.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f := &stateRead{sent: time.Now(), done: make(chan struct{})}
	st.reading = f
	st.mu.Unlock()

	cctx := context.WithoutCancel(ctx)
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		cctx, cancel = context.WithDeadline(cctx, dl)
		defer cancel()
	}
	r.refreshes.Add(1)
	_, _, _, f.err = r.read(cctx, queue, 0, f.sent)
	st.mu.Lock()
	if st.reading == f {
		st.reading = nil
	}
	st.mu.Unlock()
	close(f.done)
	return f.err
}

// young reports whether c has no sample yet or is young (youngFor).
func young(c *serverClock) bool {
	_, _, y, ok := c.bounds(time.Now())
	return !ok || y
}

// ask is check with a round trip to Redis of its own.
func (r *Redis) ask(ctx context.Context, queue string, s Slot) (time.Duration, bool, Slot, error) {
	paused, valid, placed, err := r.read(ctx, queue, s.epoch, time.Now())
	if err != nil {
		return 0, false, s, err
	}
	if placed != nil && s.sched != 0 {
		lo, hi, young := placed.lo, placed.hi, placed.young
		c := r.clock(queue)
		s.At, s.early, s.strict = c.local(s.sched, hi), c.local(s.sched, lo), young
	}
	return paused, valid, s, nil
}

// offsets are a serverClock's bounds as a sample left them.
type offsets struct {
	lo, hi int64
	young  bool
}

// read runs the paused script for a reservation of epoch (0: none), sent at sent: it records
// the state it read (seen) and, on the real clock, the sample in the queue's clock, whose
// bounds it returns (nil on a fixed clock).
func (r *Redis) read(ctx context.Context, queue string, epoch int64, sent time.Time) (time.Duration, bool, *offsets, error) {
	args := []any{epoch}
	if r.now != nil {
		args = append(args, r.now().UnixMicro())
	}
	res, err := pausedScript.Run(ctx, r.rdb, []string{r.key(queue)}, args...).Int64Slice()
	recv := time.Now()
	if err != nil {
		return 0, false, nil, fmt.Errorf("leaky: paused %q: %w", queue, err)
	}
	if len(res) != 4 {
		return 0, false, nil, fmt.Errorf("leaky: paused %q: unexpected reply %v", queue, res)
	}
	paused, server, state := res[0], res[2], res[3]
	if r.now != nil {
		return time.Duration(paused) * time.Microsecond, res[1] == 1, nil, nil
	}
	if paused > 0 {
		r.seen(queue).saw(sent, server, state, server+paused)
	} else {
		r.seen(queue).saw(sent, server, state, 0)
	}
	lo, hi, young := r.clock(queue).observe(sent, recv, server)
	return time.Duration(paused) * time.Microsecond, res[1] == 1, &offsets{lo, hi, young}, nil
}

var (
	_ Schedule = (*Redis)(nil)
	_ checker  = (*Redis)(nil)
)
