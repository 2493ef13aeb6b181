package limit

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisClient is what the Redis store needs of a go-redis client: scripts and pipelines.
// *redis.Client, *redis.ClusterClient, *redis.Ring and redis.UniversalClient have it.
type RedisClient interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
}

// RedisConfig configures a Redis store. The zero value is ready to use.
type RedisConfig struct {
	// Prefix starts every key the store writes (default "sluice:").
	Prefix string
	// Now is for tests only. When set, the scripts decide at the instant it returns instead
	// of at the Redis server's TIME, so that tests can replay fixed instants; and since Redis
	// counts TTLs on its own clock, keys then live at least an hour. In production leave it
	// nil: the server's clock is the one clock every replica agrees on.
	Now func() time.Time

	// MaxBatch is the most decisions one shared pipeline carries (default 128). Concurrent
	// decisions are coalesced: while Pipelines pipelines are in flight, the decisions that
	// arrive wait and go together in the next one, so that under load a round trip carries
	// many decisions instead of one. A call never waits for company: when fewer than Pipelines
	// are in flight it is sent at once, so a lone caller pays what it would without
	// coalescing. The decisions of one DecideAll are never split (one larger than MaxBatch
	// goes alone). At most 4 × MaxBatch decisions wait; further calls wait for room (or their
	// ctx).
	// A negative MaxBatch turns coalescing off: each Decide is then one EVALSHA and each
	// DecideAll one pipeline of its own, sent at once on a connection of the client's pool.
	MaxBatch int
	// Pipelines is the most pipelines of coalesced decisions in flight at once (default 4),
	// and so the most connections the store holds at once: up to that many concurrent calls
	// each get a round trip of their own, as without coalescing, and only beyond it do calls
	// wait to share one. Fewer make callers wait where separate round trips would still have
	// been faster (with 1, a second concurrent caller waits for the first one's round trip);
	// the default is where, on a 2-core machine, coalescing stopped costing anything at low
	// concurrency (BENCHMARKS.md). It is ignored when MaxBatch is negative.
	Pipelines int

	// OnLoss, when set, is called once per loss of Redis's state the store learns of (per
	// group: the store on a single Redis, a hash slot on a Redis Cluster), with the key whose
	// decision learned it; a metric and a log line go there. It runs on the deciding goroutine
	// and must not block. See ResetMode.
	OnLoss func(key string)
}

// Defaults of RedisConfig.
const (
	DefaultMaxBatch  = 128
	DefaultPipelines = 4
)

// Redis is a Limiter whose state lives in Redis, shared by every process that uses the same
// server (or cluster) and prefix. Each decision is one Lua script, run atomically on the
// server at the server's TIME, in one round trip; DecideAll decides the requests of one group
// of keys (all of them on a single Redis) in one script run and pipelines the runs into one
// round trip (multi.go). It is safe for concurrent use.
//
// Concurrent decisions share round trips (see RedisConfig.MaxBatch): a call that finds fewer
// than Pipelines pipelines in flight is sent at once, on the caller's goroutine; calls that
// arrive while they are all in flight are queued and sent together, as one pipeline, by one
// of them when a pipeline returns. Each script still runs atomically on its own; only the
// network round trip is shared. The store starts no goroutine and needs no Close.
//
// Keys are Prefix + "{" + a short algorithm name + ":" + key + "}". The braces are a Redis
// Cluster hash tag: all the state of one decision is in one key anyway, and the tag keeps it
// so should a script ever touch two. As with Memory, the state of a key is shared by every
// limit of the same algorithm, so callers put the rule's name in the key. Every key has a TTL
// that ends when its state becomes idle, so idle keys vanish. Values are the algorithm's state
// packed as base-128 varints (lua/lib.lua); sliding logs are sorted sets of timestamps. The IDs
// of the extra charges Adjust made (Decision.ChargeID) are a sorted set beside the state, at
// its key + ":c": after the hash tag, so in the state's slot.
//
// Scripts run with EVALSHA; a server that does not know a script (after a restart, a
// failover or SCRIPT FLUSH) gets it with EVAL, which also caches it.
type Redis struct {
	rdb    RedisClient
	prefix string
	now    func() time.Time
	batch  *batcher // nil when coalescing is off
	epochs *epochs
	// grouping is how DecideAll groups requests into runs of lua/multi.lua (multi.go).
	grouping grouping
}

// NewRedis returns a Redis store over rdb. It does not contact the server.
func NewRedis(rdb RedisClient, cfg RedisConfig) *Redis {
	r := &Redis{rdb: rdb, prefix: cfg.Prefix, now: cfg.Now, grouping: groupingOf(rdb)}
	if r.prefix == "" {
		r.prefix = "sluice:"
	}
	r.epochs = newEpochs(rdb, r.prefix, cfg.OnLoss)
	if cfg.MaxBatch >= 0 {
		b := &batcher{rdb: rdb, maxBatch: cfg.MaxBatch, maxFlight: cfg.Pipelines}
		if b.maxBatch == 0 {
			b.maxBatch = DefaultMaxBatch
		}
		if b.maxFlight <= 0 {
			b.maxFlight = DefaultPipelines
		}
		b.maxQueue = 4 * b.maxBatch
		r.batch = b
	}
	return r
}

//go:embed lua/*.lua
var luaFiles embed.FS

// sources holds the Lua source of each algorithm's decision script: lua/lib.lua (and, for the
// token bucket, lua/peaks.lua, its record of levels), the epoch check (lua/epoch.lua,
// lua/single.lua), then the algorithm's file; adjustSources the same for its adjustment script
// (name_adjust.lua). scripts and adjustScripts hold them ready for EVALSHA. The script of
// several decisions at once is multiSource (multi.go).
var (
	sources       = luaSources("", mustRead("lua/epoch.lua")+mustRead("lua/single.lua"), "\nend)()\nepoch_reply[6] = epoch_id\nreturn epoch_reply\n")
	adjustSources = luaSources("_adjust", "", "")
	scripts       = newScripts(sources)
	adjustScripts = newScripts(adjustSources)
	// scriptSHAs are the decision scripts' hashes as EVALSHA arguments, converted to any once
	// rather than once per decision.
	scriptSHAs = func() (a [numAlgos]any) {
		for i, s := range scripts {
			a[i] = s.Hash()
		}
		return a
	}()
)

// algoFiles names each algorithm's Lua files.
var algoFiles = [numAlgos]string{
	algTokenBucket:   "token_bucket",
	algLeakyBucket:   "leaky_bucket",
	algFixedWindow:   "fixed_window",
	algSlidingLog:    "sliding_log",
	algSlidingWindow: "sliding_window",
	algGCRA:          "gcra",
}

func luaSources(suffix, before, after string) (s [numAlgos]string) {
	lib := mustRead("lua/lib.lua")
	for a, name := range algoFiles {
		extra := ""
		if algo(a) == algTokenBucket {
			extra = mustRead("lua/peaks.lua") // its record of levels
		}
		s[a] = lib + extra + before + mustRead("lua/"+name+suffix+".lua") + after
	}
	return s
}

func newScripts(sources [numAlgos]string) (s [numAlgos]*redis.Script) {
	for a, src := range sources {
		s[a] = redis.NewScript(src)
	}
	return s
}

func mustRead(name string) string {
	b, err := luaFiles.ReadFile(name)
	if err != nil {
		panic(err) // embedded at build time: cannot happen
	}
	return string(b)
}

// keyTags names each algorithm in Redis keys.
var keyTags = [numAlgos]string{
	algTokenBucket:   "tb",
	algLeakyBucket:   "lb",
	algFixedWindow:   "fw",
	algSlidingLog:    "sl",
	algSlidingWindow: "sw",
	algGCRA:          "gcra",
}

// Decide charges cost against key under l in one round trip; see [Limiter]. Over the limit is
// a Decision with Allowed false. The error wraps a sentinel error of this package when the
// input is invalid (Redis is not contacted), the client's error when Redis could not decide
// (every call of a failed shared pipeline gets it), or ctx.Err() when ctx ended first.
//
// A call whose ctx ends while it waits for a shared pipeline is not charged. One whose ctx
// ends while its script is on its way in a pipeline another call sent returns ctx.Err() at
// once, but the script may still run and charge, as a timed-out EVALSHA may. A call that is
// sending a pipeline itself returns when the client does: go-redis bounds the round trip by
// ctx's deadline when ContextTimeoutEnabled is set, else by its ReadTimeout.
func (r *Redis) Decide(ctx context.Context, key string, l Limit, cost int64) (Decision, error) {
	p, err := check(key, l, cost)
	if err != nil {
		return Decision{}, fmt.Errorf("limit: decide %.64q: %w", key, err)
	}
	var cmd *redis.Cmd
	if r.batch == nil {
		keys, args := r.call(key, l, p, cost, r.clock())
		cmd = scripts[p.alg].Run(ctx, r.rdb, keys, args...)
	} else {
		o := &op{}
		o.one[0] = r.evalSha(key, l, p, cost, r.clock())
		o.cmds = o.one[:]
		if err := r.batch.do(ctx, o); err != nil {
			return Decision{}, fmt.Errorf("limit: decide %.64q: %w", key, err)
		}
		cmd = o.cmds[0]
	}
	d, err := r.decision(key, p, cost, cmd)
	if err != nil {
		return Decision{}, fmt.Errorf("limit: decide %.64q: %w", key, err)
	}
	return d, nil
}

// Adjust reconciles an admitted request with its true cost in one round trip (shared with
// other calls' as Decide's are), by a script that runs atomically on the key Decide used, at
// the server's TIME; see [Limiter] and the package doc. A refund to a key that has expired
// does nothing. An extra charge with a ChargeID is recorded beside the key's state
// (Decision.ChargeID): made again, it changes nothing and returns ErrChargeMade. The error wraps a sentinel error of this package for bad input (Redis is not
// contacted), the client's error, or ctx.Err(); ctx is honoured as in Decide.
func (r *Redis) Adjust(ctx context.Context, key string, l Limit, d Decision, used int64) error {
	p, delta, err := checkAdjust(key, l, d, used)
	if err != nil {
		return fmt.Errorf("limit: adjust %.64q: %w", key, err)
	}
	if delta == 0 {
		return nil
	}
	k, args := r.key(key, p.alg), r.adjustArgs(p, micros(d.At), d.Cost, delta, d.ChargeID)
	marks := k + ":c" // after the hash tag: in k's slot
	var cmd *redis.Cmd
	if r.batch == nil {
		cmd = adjustScripts[p.alg].Run(ctx, r.rdb, []string{k, marks}, args...)
	} else {
		o := &op{}
		o.one[0] = redis.NewCmd(context.Background(), append([]any{"evalsha", adjustScripts[p.alg].Hash(), 2, k, marks}, args...)...)
		o.cmds = o.one[:]
		if err := r.batch.do(ctx, o); err != nil {
			return fmt.Errorf("limit: adjust %.64q: %w", key, err)
		}
		cmd = o.cmds[0]
	}
	if err := cmd.Err(); err != nil {
		return fmt.Errorf("limit: adjust %.64q: %w", key, err)
	}
	switch n, _ := cmd.Int64(); n {
	case 2:
		return fmt.Errorf("limit: adjust %.64q: %w", key, ErrDebtCapped)
	case 3:
		return fmt.Errorf("limit: adjust %.64q: charge %d: %w", key, d.ChargeID, ErrChargeMade)
	}
	return nil
}

// adjustArgs returns the ARGV of the adjustment script of p.alg; the scripts' headers
// document them.
func (r *Redis) adjustArgs(p params, at, charged, delta int64, id uint64) []any {
	sid := strconv.FormatUint(id, 10)
	switch p.alg {
	case algTokenBucket, algLeakyBucket, algGCRA:
		return []any{r.clock(), p.unit, p.refill, p.cap, at, charged, delta, p.debt, sid}
	default:
		return []any{r.clock(), p.period, p.limit, at, delta, p.debt, sid}
	}
}

// DecideAll decides every request in one pipelined round trip (two when the server had to be
// sent a script it did not know); see [Limiter]. The requests whose keys share a group (all
// of them on a single Redis, those of one hash slot on a Redis Cluster) are decided by one
// script run (multi.go), the others by a script each. When any request is invalid it returns
// an error wrapping a sentinel error of this package and charges nothing. When Redis fails,
// some of the requests may have been charged. The requests of one call always travel in one
// pipeline, alone or shared with other calls'; ctx is honoured as in Decide.
func (r *Redis) DecideAll(ctx context.Context, reqs []Request) ([]Decision, error) {
	ps := make([]params, len(reqs))
	for i, q := range reqs {
		p, err := check(q.Key, q.Limit, q.Cost)
		if err != nil {
			return nil, fmt.Errorf("limit: decide request %d %.64q: %w", i, q.Key, err)
		}
		ps[i] = p
	}
	if len(reqs) == 0 {
		return []Decision{}, nil
	}
	runs := r.runs(reqs, ps, r.clock())
	o := &op{cmds: make([]*redis.Cmd, len(runs)), decisions: len(reqs)}
	for k := range runs {
		o.cmds[k] = runs[k].cmd
	}
	if r.batch == nil {
		r.pipeline(ctx, o.cmds)
	} else if err := r.batch.do(ctx, o); err != nil {
		return nil, fmt.Errorf("limit: decide %d requests: %w", len(reqs), err)
	}
	return r.decisions(reqs, ps, runs, o.cmds)
}

// clock returns ARGV[1] of the scripts: the test-only instant, or "" for the server's TIME.
func (r *Redis) clock() string {
	if r.now == nil {
		return ""
	}
	return strconv.FormatInt(micros(r.now()), 10)
}

// call returns the KEYS and ARGV of the script of p.alg (a limit l); the scripts' headers and
// lua/epoch.lua document them.
func (r *Redis) call(key string, l Limit, p params, cost int64, now string) ([]string, []any) {
	k := r.key(key, p.alg)
	_, ek, known := r.epochs.group(k)
	hold := resetHold(l, p)
	keys := []string{k, ek}
	switch p.alg {
	case algTokenBucket:
		return keys, []any{now, p.unit, p.refill, p.cap, cost, recArg(p), known, hold, r.epochs.flag}
	case algLeakyBucket, algGCRA:
		return keys, []any{now, p.unit, p.refill, p.cap, cost, known, hold, r.epochs.flag}
	default:
		return keys, []any{now, p.period, p.limit, cost, known, hold, r.epochs.flag}
	}
}

// recArg is the token bucket script's ARGV[6]: 1 when it keeps its record of levels.
func recArg(p params) int64 {
	if p.rec {
		return 1
	}
	return 0
}

// resetHold is the reset hold of l (of params p) in µs, 0 unless l is conservative.
func resetHold(l Limit, p params) int64 {
	if l.OnReset != ResetConservative {
		return 0
	}
	return p.resetHold()
}

// key returns the Redis key of key's state under algorithm a.
func (r *Redis) key(key string, a algo) string {
	return r.prefix + "{" + keyTags[a] + ":" + key + "}"
}

// evalSha returns the EVALSHA of the script of p.alg with the KEYS and ARGV of call, built
// with one slice of arguments.
func (r *Redis) evalSha(key string, l Limit, p params, cost int64, now string) *redis.Cmd {
	k := r.key(key, p.alg)
	_, ek, known := r.epochs.group(k)
	hold := resetHold(l, p)
	sha := scriptSHAs[p.alg]
	switch p.alg {
	case algTokenBucket:
		return redis.NewCmd(context.Background(), "evalsha", sha, 2, k, ek, now, p.unit, p.refill, p.cap, cost, recArg(p), known, hold, r.epochs.flag)
	case algLeakyBucket, algGCRA:
		return redis.NewCmd(context.Background(), "evalsha", sha, 2, k, ek, now, p.unit, p.refill, p.cap, cost, known, hold, r.epochs.flag)
	default:
		return redis.NewCmd(context.Background(), "evalsha", sha, 2, k, ek, now, p.period, p.limit, cost, known, hold, r.epochs.flag)
	}
}

// decision reads a script's reply {allowed, remaining, reset_after µs, retry_after µs, at µs,
// epoch} to a request of cost against key, and records the epoch.
func (r *Redis) decision(key string, p params, cost int64, cmd *redis.Cmd) (Decision, error) {
	v, err := cmd.Int64Slice()
	if err != nil {
		return Decision{}, err
	}
	if len(v) != 6 {
		return Decision{}, fmt.Errorf("limit: script returned %d values, want 6", len(v))
	}
	args := cmd.Args()
	known, _ := args[len(args)-3].(int64)
	g := 0
	if r.epochs.cluster {
		g = hashSlot(r.key(key, p.alg))
	}
	r.epochs.saw(g, known, v[5], key)
	return decisionOf(p, cost, v[:5]), nil
}

// decisionOf reads a decision's reply {allowed, remaining, reset_after µs, retry_after µs,
// at µs} to a request of cost under p.
func decisionOf(p params, cost int64, v []int64) Decision {
	d := Decision{
		Allowed:    v[0] == 1,
		Limit:      p.limit,
		Remaining:  v[1],
		ResetAfter: us(v[2]),
		RetryAfter: us(v[3]),
		At:         instant(v[4]),
	}
	if d.Allowed {
		d.Cost = cost
	}
	return d
}

func noScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}
