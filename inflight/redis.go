package inflight

import (
	"context"
	"crypto/rand"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/acquire.lua
	acquireLua    string
	acquireScript = redis.NewScript(epochLua + acquireLua)

	//go:embed lua/release.lua
	releaseLua    string
	releaseScript = redis.NewScript(releaseLua)

	//go:embed lua/count.lua
	countLua    string
	countScript = redis.NewScript(countLua)
)

// DefaultPrefix starts the keys and the channel of a Redis store unless WithPrefix says
// otherwise.
const DefaultPrefix = "sluice:inflight:"

// subscribeTimeout bounds the wait for Redis to confirm a Redis store's subscription: a
// second, as a command's round trip is bounded (package connect), so that the first Wait of a
// store cut off from Redis fails as soon as a command would, not after seconds. A Wait that
// fails to subscribe fails; the next subscribes again.
const subscribeTimeout = time.Second

// RedisOption configures a Redis store.
type RedisOption func(*Redis)

// WithPrefix sets the string that starts every key and the channel of the store (default
// DefaultPrefix). Stores share places when they share a server and a prefix. A prefix should
// hold no '{': the hash tag belongs in the caps' keys.
func WithPrefix(prefix string) RedisOption { return func(r *Redis) { r.prefix = prefix } }

// WithRecheck sets how long a Wait sleeps at most between attempts when no release wakes it
// (default DefaultRecheck): the longest a lost notification delays a waiter.
func WithRecheck(d time.Duration) RedisOption {
	return func(r *Redis) {
		if d > 0 {
			r.recheck = d
		}
	}
}

// Redis is a Store in Redis, shared by every process that uses the same server (or Redis
// Cluster) and prefix. Acquire, Release and each attempt of a Wait are one Lua script each,
// atomic on the server at its TIME, in one round trip (EVALSHA, and EVAL once after the server
// forgot the script). It is safe for concurrent use.
//
// The key of cap k is prefix + k; the keys of one Acquire must share a hash slot (ErrCrossSlot
// otherwise; the check runs for every client, not only on a cluster). Releases are published
// on the channel prefix + "released". The first Wait subscribes to it — one subscription, one
// connection and one goroutine per store, whatever the number of waiters — and Close ends it.
// Errors wrap the client's; ctx bounds a call as far as the client honours it (go-redis:
// reads and writes with ContextTimeoutEnabled, else its ReadTimeout).
type Redis struct {
	rdb     redis.UniversalClient
	prefix  string
	recheck time.Duration
	margin  time.Duration
	onLoss  func(key string)
	cluster any // "1" on a Redis Cluster: epoch keys record their node (epoch.go), else "0"; an any once, not per call
	waiters waiters

	gmu     sync.Mutex
	groups  map[string]*group // epoch key → what this store knows of its group
	sweepAt int               // len(groups) at which the next sweep of idle groups runs

	mu   sync.Mutex
	ps   *redis.PubSub // nil until the first Wait
	done chan struct{} // closed when the subscription's goroutine has returned

	// stopVoids ends the leases being voided (void.go) at Close; voids counts them.
	stopVoids context.Context
	endVoids  context.CancelFunc
	voids     sync.WaitGroup
}

// NewRedis returns a store over rdb (a *redis.Client or a *redis.ClusterClient). It does not
// contact the server. Over a *redis.ClusterClient its epoch keys record their node, so that a
// failover is taken for a loss of state (epoch.go).
func NewRedis(rdb redis.UniversalClient, opts ...RedisOption) *Redis {
	r := &Redis{rdb: rdb, prefix: DefaultPrefix, recheck: DefaultRecheck, sweepAt: minSweep, cluster: "0"}
	if _, ok := rdb.(*redis.ClusterClient); ok {
		r.cluster = "1"
	}
	r.stopVoids, r.endVoids = context.WithCancel(context.Background())
	for _, o := range opts {
		o(r)
	}
	return r
}

func (r *Redis) channel() string { return r.prefix + "released" }

// keys returns the Redis keys of ks, and ErrCrossSlot when they span hash slots.
func (r *Redis) keys(ks []string) ([]string, error) {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = r.prefix + k
	}
	if len(out) > 1 {
		s := Slot(out[0])
		for _, k := range out[1:] {
			if Slot(k) != s {
				return nil, fmt.Errorf("%w: %.64q and %.64q", ErrCrossSlot, out[0], k)
			}
		}
	}
	return out, nil
}

// Acquire takes a place of every cap, or none, in one round trip; see [Store].
func (r *Redis) Acquire(ctx context.Context, caps []Cap, hold time.Duration) (Result, error) {
	return r.acquire(ctx, caps, hold, false)
}

// acquire is Acquire; when marking (an attempt of a Wait), a refusal also marks the full caps
// as waited for (waitMarks), so that their releases are published. A call that learns of a
// loss of state after its fence is over tries once more, once the store has given up the
// places it held from before.
func (r *Redis) acquire(ctx context.Context, caps []Cap, hold time.Duration, marking bool) (Result, error) {
	if err := check(caps, hold); err != nil {
		return Result{}, wrap("acquire", err)
	}
	lease := Lease{ID: rand.Text(), Keys: keysOf(caps)}
	keys, err := r.keys(lease.Keys)
	if err != nil {
		return Result{}, wrap("acquire", err)
	}
	ek, fenced := r.epochKey(keys[0])
	n := len(keys)
	var fenceFor int64
	if fenced {
		keys, fenceFor = append(keys, ek), micros(r.fenceFor(hold))
	}
	mark := int64(0)
	if marking {
		if marks, ok := waitMarks(keys[:n]); ok {
			keys, mark = append(keys, marks...), r.markFor().Milliseconds()
		}
	}
	args := make([]any, 6+len(caps))
	args[0], args[1], args[2], args[4], args[5] = lease.ID, micros(hold), mark, fenceFor, r.cluster
	for i, c := range caps {
		args[6+i] = c.Limit
	}
	for try := 0; ; try++ {
		start := time.Now()
		known := ""
		if fenced {
			known = r.known(ek, start)
		}
		args[3] = known
		res, epoch, err := r.runAcquire(ctx, caps, keys, args)
		if err != nil {
			r.void(lease, start, hold, err) // the script may run still: see void.go
			return Result{}, err
		}
		if !fenced {
			if res.Acquired {
				res.Lease = lease
			}
			return res, nil
		}
		var took *out
		if res.Acquired {
			res.Lease = lease
			took = &out{keys: keys[:n:n], hold: hold, expires: time.Now().Add(hold), epoch: epoch}
		}
		r.saw(ctx, ek, caps[0].Key, epoch, start, hold, lease.ID, took)
		if res.Acquired || res.RetryAfter > 0 || known == "" || epoch == known || try > 0 {
			return res, nil
		}
	}
}

// runAcquire runs acquire.lua and reads its answer.
func (r *Redis) runAcquire(ctx context.Context, caps []Cap, keys []string, args []any) (Result, string, error) {
	v, err := acquireScript.Run(ctx, r.rdb, keys, args...).Slice()
	if err != nil {
		return Result{}, "", fmt.Errorf("inflight: acquire %.64q: %w", caps[0].Key, err)
	}
	if len(v) != 3+len(caps) {
		return Result{}, "", fmt.Errorf("inflight: acquire %.64q: script returned %d values, want %d", caps[0].Key, len(v), 3+len(caps))
	}
	ints := make([]int64, len(v))
	for i, x := range v {
		if i == 2 {
			continue
		}
		n, ok := x.(int64)
		if !ok {
			return Result{}, "", fmt.Errorf("inflight: acquire %.64q: script returned %T", caps[0].Key, x)
		}
		ints[i] = n
	}
	epoch, _ := v[2].(string)
	res := Result{Acquired: ints[0] == 1, InFlight: ints[3:], RetryAfter: time.Duration(ints[1]) * time.Microsecond}
	return res, epoch, nil
}

// markFor is how long a Wait's refused attempt marks its full caps as waited for: a Wait
// tries again at least every recheck, so the mark lasts while it waits, and is gone within
// a second or so after the last waiter left.
func (r *Redis) markFor() time.Duration {
	d := r.recheck
	if d <= 0 {
		d = DefaultRecheck
	}
	return 4 * d
}

// waitMarks returns the waiting mark of each of keys (Redis keys of one hash slot), in its
// key's slot: key + ":waiting" for a key with a hash tag, "{key}:waiting" for one without. ok
// is false when a key's mark cannot be put in its slot (a '}' in a key without a tag): then
// releases are always published.
func waitMarks(keys []string) (marks []string, ok bool) {
	marks = make([]string, len(keys))
	for i, k := range keys {
		m := k + ":waiting"
		if Slot(m) != Slot(k) {
			m = "{" + k + "}:waiting"
		}
		if Slot(m) != Slot(k) {
			return nil, false
		}
		marks[i] = m
	}
	return marks, true
}

// Release gives l's places back in one round trip and, when it freed a live place that a
// Wait of any process is refused (its cap's waiting mark), wakes a waiter of each of its keys
// in every process; see [Store]. The zero Lease is a no-op.
func (r *Redis) Release(ctx context.Context, l Lease) error {
	if l.ID == "" || len(l.Keys) == 0 {
		return nil
	}
	keys, err := r.keys(l.Keys)
	if err != nil {
		return wrap("release", err)
	}
	r.forget(keys[0], l.ID)
	n := len(keys)
	if marks, ok := waitMarks(keys); ok {
		keys = append(keys, marks...)
	}
	freed, err := releaseScript.Run(ctx, r.rdb, keys, l.ID, r.channel(), encodeKeys(l.Keys), n).Int64()
	if err != nil {
		return fmt.Errorf("inflight: release %.64q: %w", l.Keys[0], err)
	}
	if freed > 0 {
		for _, k := range l.Keys { // this process's waiters need not wait for the message
			r.waiters.wakeKey(k)
		}
	}
	return nil
}

// forget drops lease id, of the group of Redis key key, from the leases this store has out:
// its holder no longer uses it, whatever the server answers, so it is not re-asserted.
func (r *Redis) forget(key, id string) {
	ek, ok := r.epochKey(key)
	if !ok {
		return
	}
	r.gmu.Lock()
	if g := r.groups[ek]; g != nil {
		delete(g.leases, id)
	}
	r.gmu.Unlock()
}

// Wait blocks until a place of every cap is acquired, ctx ends, or Redis fails; see [Store].
// It subscribes the store to releases first (once per store), and returns ErrClosed once the
// store is closed.
func (r *Redis) Wait(ctx context.Context, caps []Cap, hold time.Duration) (Result, error) {
	if err := check(caps, hold); err != nil {
		return Result{}, wrap("wait", err)
	}
	if err := r.subscribe(ctx); err != nil {
		return Result{}, err
	}
	return wait(ctx, &r.waiters, caps, r.recheck, func(ctx context.Context) (Result, error) {
		return r.acquire(ctx, caps, hold, true)
	})
}

// subscribe starts the store's subscription to its channel unless it runs, and returns once
// Redis confirmed it, so that no release after it is missed.
func (r *Redis) subscribe(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ps != nil {
		return nil
	}
	if r.waiters.isClosed() {
		return ErrClosed
	}
	ps := r.rdb.Subscribe(ctx, r.channel())
	if _, err := ps.ReceiveTimeout(ctx, subscribeTimeout); err != nil {
		ps.Close()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return wrap("subscribe", err)
	}
	r.ps, r.done = ps, make(chan struct{})
	go r.listen(ps.Channel(), r.done)
	return nil
}

// listen wakes the waiters of the keys of every release published, until the subscription is
// closed. go-redis re-subscribes after a lost connection; what was published meanwhile is
// lost, and the waiters' re-check covers it.
func (r *Redis) listen(msgs <-chan *redis.Message, done chan struct{}) {
	defer close(done)
	for m := range msgs {
		if !r.waiters.any() {
			continue
		}
		decodeKeys(m.Payload, r.waiters.wakeKey)
	}
}

// Close ends the store's subscription and makes every Wait, blocked or to come, return
// ErrClosed; it stops voiding leases (void.go). Acquire, Release and InFlight still work. It
// does not close the client.
func (r *Redis) Close() error {
	r.waiters.close()
	r.endVoids()
	r.voids.Wait()
	r.mu.Lock()
	ps, done := r.ps, r.done
	r.ps = nil
	r.mu.Unlock()
	if ps == nil {
		return nil
	}
	err := ps.Close()
	<-done
	return err
}

// InFlight reads the places held under each key, in one round trip (one script per key,
// pipelined); see [Store].
func (r *Redis) InFlight(ctx context.Context, keys ...string) ([]int64, error) {
	out := make([]int64, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	cmds := make([]*redis.Cmd, len(keys))
	pipe := r.rdb.Pipeline()
	for i, k := range keys {
		cmds[i] = countScript.EvalSha(ctx, pipe, []string{r.prefix + k})
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	var again redis.Pipeliner
	for i, k := range keys {
		if noScript(cmds[i].Err()) {
			if again == nil {
				again = r.rdb.Pipeline()
			}
			cmds[i] = countScript.Eval(ctx, again, []string{r.prefix + k})
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
	}
	for i, c := range cmds {
		n, err := c.Int64()
		if err != nil {
			return nil, fmt.Errorf("inflight: in flight %.64q: %w", keys[i], err)
		}
		out[i] = n
	}
	return out, nil
}

func noScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// encodeKeys writes keys as a release's message: each as its length in decimal, ':', the key.
func encodeKeys(keys []string) string {
	var b []byte
	for _, k := range keys {
		b = strconv.AppendInt(b, int64(len(k)), 10)
		b = append(b, ':')
		b = append(b, k...)
	}
	return string(b)
}

// decodeKeys calls f with each key of a message written by encodeKeys; it stops at the first
// malformed part.
func decodeKeys(msg string, f func(string)) {
	for msg != "" {
		i := 0
		for i < len(msg) && msg[i] >= '0' && msg[i] <= '9' {
			i++
		}
		if i == 0 || i >= len(msg) || msg[i] != ':' {
			return
		}
		n, err := strconv.Atoi(msg[:i])
		if err != nil || n > len(msg)-i-1 {
			return
		}
		f(msg[i+1 : i+1+n])
		msg = msg[i+1+n:]
	}
}

var _ Store = (*Redis)(nil)
