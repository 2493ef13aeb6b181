package leaky

import (
	"context"
	_ "embed"
	"fmt"
	"sync"
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
// queue's clock is no longer young (youngFor), and from a round trip otherwise. Wait checks
// checkLead before the slot, so a slot is used only if the queue's state was read at most
// twice checkLead before it, and not paused then: a pause made by another process stops the
// slots due that long after it, one made by this process (Pause drops what it saw) every slot
// it has not yet released.
func (r *Redis) check(ctx context.Context, queue string, s Slot) (time.Duration, bool, Slot, error) {
	if r.now == nil && s.epoch != 0 {
		now := time.Now()
		if server, epoch, pu, ok := r.seen(queue).since(now.Add(-checkLead)); ok {
			c := r.clock(queue)
			// While the clock is young its bounds may still be as wide as a loaded start's
			// round trips: the check's own round trip, on a calmer machine, narrows them.
			if lo, hi, young, ok := c.bounds(now); ok && !young {
				s.At, s.early, s.strict = c.local(s.sched, hi), c.local(s.sched, lo), false
				return time.Duration(max(pu-server, 0)) * time.Microsecond, epoch == s.epoch, s, nil
			}
		}
	}
	return r.ask(ctx, queue, s)
}

// ask is check with a round trip to Redis.
func (r *Redis) ask(ctx context.Context, queue string, s Slot) (time.Duration, bool, Slot, error) {
	args := []any{s.epoch}
	if r.now != nil {
		args = append(args, r.now().UnixMicro())
	}
	sent := time.Now()
	res, err := pausedScript.Run(ctx, r.rdb, []string{r.key(queue)}, args...).Int64Slice()
	recv := time.Now()
	if err != nil {
		return 0, false, s, fmt.Errorf("leaky: paused %q: %w", queue, err)
	}
	if len(res) != 4 {
		return 0, false, s, fmt.Errorf("leaky: paused %q: unexpected reply %v", queue, res)
	}
	paused, server, epoch := res[0], res[2], res[3]
	if r.now == nil {
		if paused > 0 {
			r.seen(queue).saw(sent, server, epoch, server+paused)
		} else {
			r.seen(queue).saw(sent, server, epoch, 0)
		}
	}
	if r.now == nil && s.sched != 0 {
		c := r.clock(queue)
		lo, hi, young := c.observe(sent, recv, server)
		s.At, s.early, s.strict = c.local(s.sched, hi), c.local(s.sched, lo), young
	}
	return time.Duration(paused) * time.Microsecond, res[1] == 1, s, nil
}

var (
	_ Schedule = (*Redis)(nil)
	_ checker  = (*Redis)(nil)
)
