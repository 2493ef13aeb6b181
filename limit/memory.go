package limit

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// MemoryConfig configures a Memory store. The zero value is ready to use.
type MemoryConfig struct {
	// MaxKeys bounds the number of keys the store holds state for (0: 1<<20). When it is
	// reached, a new key takes the place of an idle key (one whose state is back to fresh); when
	// none is found, the new key is decided on its scope's overflow state instead (see Memory).
	// A key that still holds state is never evicted.
	MaxKeys int
	// OnOverflow, if set, is called when a new key is decided on an overflow state, at most once
	// a second (with the number of such decisions so far); it must not block.
	OnOverflow func(total uint64)
	// Shards is the number of independently locked parts of the store, rounded up to a power
	// of two (0: 64), and lowered so that each shard holds at least one key.
	Shards int
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Memory is a Limiter that keeps its state in this process: the limiter of a single process,
// and the reference the Redis store is tested against. It is safe for concurrent use; its
// methods never block on I/O, and the ctx they take is unused.
//
// Keys are identified by a 61-bit hash of (algorithm, key) with a seed chosen at random per
// store, not by the key itself, so a key costs no more than its state: about 50 bytes for every
// algorithm but SlidingLog, whose log also holds 8 bytes per logged request, and TokenBucket,
// whose record of levels for exact refunds (peaks.go) brings it to about 145 bytes, and 24 more
// a level beyond the first (8 at most, allocated as the record grows: by a decision, or by an
// Adjust that charges more). Two keys share a
// state only if their hashes collide: for a million keys, a chance of about 1 in 5 million
// that any two do. The state of a key is shared by every limit of
// the same algorithm: callers that apply several limits to one key put the rule's name in the
// key. A key whose state is idle (its ResetAfter has passed) decides as a new key would; idle
// keys are removed as new keys arrive (a few at a time), when MaxKeys is reached, or by Sweep.
//
// A key whose state still matters (a spent bucket, a full window) is never forgotten, so a flood
// of new keys cannot reset another key's exhausted limit. When the store is full of such keys, a
// new key is charged against one overflow state per scope and limit instead, where a key's scope
// is its text up to its first NUL byte (the ingress puts the rule's name there; a key without
// one has the empty scope): every new key of a rule then shares one limit until room frees up —
// limited, never unlimited. Such
// decisions are counted (Overflows) and reported through MemoryConfig.OnOverflow. SetScopes
// gives each scope its own share of MaxKeys, so that a flood of new keys in one scope (a cheap
// rule) never sends another scope's new keys to its overflow state. Each key costs 2 more bytes
// for it (its scope's index), and a new key one map lookup of its scope.
type Memory struct {
	now        func() time.Time
	seeds      [numAlgos]maphash.Seed
	shards     []shard
	shift      uint // a hash's top bits choose its shard: h >> shift
	onOverflow func(uint64)
	overflows  atomic.Uint64
	reported   atomic.Int64 // when onOverflow was last called, Unix seconds
	marks      chargeMarks
}

// memoryChargeMarks is the most charge IDs a Memory store records (Decision.ChargeID): in
// markShards parts chosen by the ID's low bits, each locked on its own, of buckets of
// markWays IDs chosen by the next bits.
const (
	memoryChargeMarks = 1 << 16
	markShards        = 16
	markWays          = 4
	markBuckets       = memoryChargeMarks / markShards / markWays
)

// chargeMarks records the IDs of the extra charges a Memory store made, each for
// ChargeMarkTTL: the memory side of lua/lib.lua's charge_once. An ID is forgotten before then
// only to make room, in its bucket of markWays, for a newer one that ends later: the store
// holds about the latest memoryChargeMarks (a set-associative cache, 1 MiB once used, with no
// map to grow or churn). Its zero value is ready to use; it is safe for concurrent use.
type chargeMarks struct {
	shards [markShards]markShard
}

// markShard is one part of chargeMarks: the IDs whose low bits choose it.
type markShard struct {
	mu sync.Mutex
	b  *[markBuckets]markBucket // nil until the first ID
	_  [64]byte                 // keeps neighbouring locks off one cache line
}

// markBucket is markWays IDs and when each expires, µs (0: an empty place).
type markBucket struct {
	ids [markWays]uint64
	exp [markWays]int64
}

// once records id at now (µs) and reports whether it was not recorded (or had expired).
func (c *chargeMarks) once(id uint64, now int64) bool {
	s := &c.shards[id%markShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b == nil {
		s.b = new([markBuckets]markBucket)
	}
	b := &s.b[id/markShards%markBuckets]
	oldest := 0
	for i := range markWays {
		if b.ids[i] == id && b.exp[i] > now {
			return false
		}
		if b.exp[i] < b.exp[oldest] {
			oldest = i
		}
	}
	b.ids[oldest], b.exp[oldest] = id, now+ChargeMarkTTL.Microseconds()
	return true
}

// NewMemory returns an empty Memory store.
func NewMemory(cfg MemoryConfig) *Memory {
	maxKeys := cfg.MaxKeys
	if maxKeys <= 0 {
		maxKeys = 1 << 20
	}
	n := cfg.Shards
	if n <= 0 {
		n = 64
	}
	n = 1 << bits.Len(uint(n-1)) // round up to a power of two
	for n > maxKeys {
		n /= 2
	}
	m := &Memory{
		now:        cfg.Now,
		shards:     make([]shard, n),
		shift:      uint(64 - bits.TrailingZeros(uint(n))),
		onOverflow: cfg.OnOverflow,
	}
	if m.now == nil {
		m.now = time.Now
	}
	for i := range m.seeds {
		m.seeds[i] = maphash.MakeSeed()
	}
	for i := range m.shards {
		m.shards[i].t.max = maxKeys / n
	}
	return m
}

// Decide charges cost against key under l; see [Limiter]. Over the limit is a Decision with
// Allowed false; the error wraps a sentinel error of this package when the input is invalid.
func (m *Memory) Decide(_ context.Context, key string, l Limit, cost int64) (Decision, error) {
	p, err := check(key, l, cost)
	if err != nil {
		return Decision{}, fmt.Errorf("limit: decide %.64q: %w", key, err)
	}
	return m.decide(key, p, cost, m.now()), nil
}

// DecideAll decides every request at the same instant; see [Limiter]. When any request is
// invalid it returns an error wrapping a sentinel error of this package and charges nothing.
func (m *Memory) DecideAll(_ context.Context, reqs []Request) ([]Decision, error) {
	ps := make([]params, len(reqs))
	for i, r := range reqs {
		p, err := check(r.Key, r.Limit, r.Cost)
		if err != nil {
			return nil, fmt.Errorf("limit: decide request %d %.64q: %w", i, r.Key, err)
		}
		ps[i] = p
	}
	now := m.now()
	out := make([]Decision, len(reqs))
	for i, r := range reqs {
		out[i] = m.decide(r.Key, ps[i], r.Cost, now)
	}
	return out, nil
}

// Adjust reconciles an admitted request with its true cost; see [Limiter] and the package doc.
// A refund to a key the store holds no state for (forgotten as idle, or decided on an overflow
// state) does nothing; an extra charge to a new key when the store is full goes to the scope's
// overflow state, as a decision would. An extra charge with a ChargeID made again changes
// nothing and returns ErrChargeMade (the store records the latest 65 536 IDs, for
// ChargeMarkTTL). It takes a shard lock, allocates nothing (but the room
// for entries a sliding log grows by, and 64 KiB for each sixteenth of the record of charge
// IDs on its first use), and returns an error only for bad input.
func (m *Memory) Adjust(_ context.Context, key string, l Limit, d Decision, used int64) error {
	p, delta, err := checkAdjust(key, l, d, used)
	if err != nil {
		return fmt.Errorf("limit: adjust %.64q: %w", key, err)
	}
	if delta == 0 {
		return nil
	}
	now := m.now()
	if delta > 0 && d.ChargeID != 0 && !m.marks.once(d.ChargeID, micros(now)) {
		return fmt.Errorf("limit: adjust %.64q: charge %d: %w", key, d.ChargeID, ErrChargeMade)
	}
	if m.adjust(key, p, micros(d.At), d.Cost, delta, now) {
		return fmt.Errorf("limit: adjust %.64q: %w", key, ErrDebtCapped)
	}
	return nil
}

// Len returns the number of keys the store holds state for, idle keys not yet removed included.
func (m *Memory) Len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += sh.t.n
		sh.mu.Unlock()
	}
	return n
}

// Sweep removes the state of every idle key and returns how many it removed. The store never
// needs it to stay within MaxKeys; a caller that wants memory back after a burst of one-off
// keys may call it from time to time. It locks one shard at a time.
func (m *Memory) Sweep() int {
	now := micros(m.now())
	removed := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		removed += sh.t.sweep(now, sh.t.used)
		for id, e := range sh.over {
			if e.exp <= now {
				delete(sh.over, id)
				delete(sh.t.logs, id)
				delete(sh.t.peaks, id)
			}
		}
		sh.mu.Unlock()
	}
	return removed
}

// SetScopes shares the key budget among n scopes (a key's scope is its text up to its first
// NUL byte: the ingress's rule name). Each scope is sure of MaxKeys/n keys: once a scope holds
// its share, its new keys take only room that no other scope's unused share reserves, and are
// decided on the scope's overflow state when there is none. A flood of keys in one scope then
// leaves every other scope its share. n < 2 (the default) shares nothing: the first keys to
// come take the room. Keys already held are kept whatever n; it is safe to call at any time.
func (m *Memory) SetScopes(n int) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		sh.t.sc.setShares(n, sh.t.max)
		sh.mu.Unlock()
	}
}

// Overflows returns the number of decisions made on an overflow state because the store was
// full of keys that still hold state.
func (m *Memory) Overflows() uint64 { return m.overflows.Load() }

func (m *Memory) decide(key string, p params, cost int64, now time.Time) Decision {
	h := maphash.String(m.seeds[p.alg], key)
	sh := &m.shards[h>>m.shift]
	id := h&^flagMask | flagUsed
	t := micros(now)

	sh.mu.Lock()
	e := sh.t.get(id, t, p.ext(), key)
	if e == nil {
		sh.mu.Unlock()
		return m.decideOverflow(key, p, cost, now)
	}
	rec := sh.t.peaks[id]
	if p.rec && rec == nil {
		rec = sh.t.addPeaks(e, id, t) // the limit took Refunds after the key's state began
	}
	d := apply(e, sh.t.logs[id], rec, p, cost, now)
	sh.mu.Unlock()
	return d
}

// adjust runs an adjustment and reports whether its charge was capped.
func (m *Memory) adjust(key string, p params, at, charged, delta int64, now time.Time) (capped bool) {
	h := maphash.String(m.seeds[p.alg], key)
	sh := &m.shards[h>>m.shift]
	id := h&^flagMask | flagUsed

	sh.mu.Lock()
	var e *entry
	if delta < 0 {
		e = sh.t.find(id)
	} else {
		e = sh.t.get(id, micros(now), p.ext(), key)
	}
	if e != nil {
		capped = applyAdjust(e, sh.t.logs[id], sh.t.peaks[id], p, at, charged, delta, now)
	}
	sh.mu.Unlock()
	if e == nil && delta > 0 {
		sh, e, log, rec := m.overflowState(key, p)
		capped = applyAdjust(e, log, rec, p, at, charged, delta, now)
		sh.mu.Unlock()
	}
	return capped
}

// decideOverflow decides a new key that found the store full on its scope's overflow state,
// which lives outside the bounded table of the shard its own hash chooses.
func (m *Memory) decideOverflow(key string, p params, cost int64, now time.Time) Decision {
	sh, e, log, rec := m.overflowState(key, p)
	d := apply(e, log, rec, p, cost, now)
	sh.mu.Unlock()

	n := m.overflows.Add(1)
	if m.onOverflow != nil {
		sec := now.Unix()
		if last := m.reported.Load(); sec > last && m.reported.CompareAndSwap(last, sec) {
			m.onOverflow(n)
		}
	}
	return d
}

// overflowState returns the overflow state of key's scope under p (and its log, for
// SlidingLog, or its record, for TokenBucket), creating it if needed, with the lock of its
// shard held.
func (m *Memory) overflowState(key string, p params) (*shard, *entry, *slidingLogState, *peaks) {
	scope, _, found := strings.Cut(key, "\x00")
	if !found {
		scope = ""
	}
	h := maphash.String(m.seeds[p.alg], fmt.Sprintf("\xffoverflow\x00%s\x00%d/%d/%d", scope, p.limit, p.period, p.capacity))
	sh := &m.shards[h>>m.shift]
	id := h&^flagMask | flagUsed

	sh.mu.Lock()
	e := sh.over[id]
	if e == nil {
		if sh.over == nil {
			sh.over = make(map[uint64]*entry)
		}
		e = &entry{id: id}
		sh.over[id] = e
	}
	var log *slidingLogState
	if p.alg == algSlidingLog {
		if log = sh.t.logs[id]; log == nil {
			if sh.t.logs == nil {
				sh.t.logs = make(map[uint64]*slidingLogState)
			}
			log = &slidingLogState{}
			sh.t.logs[id] = log
		}
	}
	var rec *peaks
	if p.rec {
		if rec = sh.t.peaks[id]; rec == nil {
			if sh.t.peaks == nil {
				sh.t.peaks = make(map[uint64]*peaks)
			}
			rec = &peaks{}
			sh.t.peaks[id] = rec
		}
	}
	return sh, e, log, rec
}

// ext is the flag of table.get for a key of p's algorithm: the state it keeps besides an entry.
func (p params) ext() uint64 {
	switch p.alg {
	case algSlidingLog:
		return flagLog
	case algTokenBucket:
		if p.rec {
			return flagPeaks
		}
	}
	return 0
}

// recOf is a TokenBucket key's record of levels: *rec, or an empty one that knows nothing (a
// key of a limit without Refunds keeps none).
func recOf(rec *peaks) peaks {
	if rec == nil {
		return peaks{Since: math.MaxInt64}
	}
	return *rec
}

// apply runs the algorithm of p on the state in e (and log, for SlidingLog; rec, for
// TokenBucket) and sets when the state becomes idle.
func apply(e *entry, log *slidingLogState, rec *peaks, p params, cost int64, now time.Time) Decision {
	t := micros(now)
	var d Decision
	from := t // the instant the algorithm decided at: its clock never runs backwards
	switch p.alg {
	case algTokenBucket:
		var s tokenBucketState
		s, d = tokenBucket(tokenBucketState{e.s[0], e.s[1], e.s[2], recOf(rec)}, p, cost, now)
		e.s = [3]int64{s.Tokens, s.Last, s.Unit}
		if rec != nil {
			*rec = s.Rec
		}
		from = s.Last
	case algLeakyBucket:
		var s leakyBucketState
		s, d = leakyBucket(leakyBucketState{e.s[0], e.s[1], e.s[2]}, p, cost, now)
		e.s = [3]int64{s.Level, s.Last, s.Unit}
		from = s.Last
	case algGCRA:
		var s gcraState
		s, d = gcra(gcraState{e.s[0], e.s[1]}, p, cost, now)
		e.s = [3]int64{s.TAT, s.Frac}
	case algFixedWindow:
		var s fixedWindowState
		s, d = fixedWindow(fixedWindowState{e.s[0], e.s[1]}, p, cost, now)
		e.s = [3]int64{s.Start, s.Count}
		from = max(t, s.Start)
	case algSlidingWindow:
		var s slidingWindowState
		s, d = slidingWindow(slidingWindowState{e.s[0], e.s[1], e.s[2]}, p, cost, now)
		e.s = [3]int64{s.Start, s.Prev, s.Cur}
		from = max(t, s.Start)
	case algSlidingLog:
		d = slidingLog(log, p, cost, now)
		if log.n > 0 {
			from = max(t, log.at(log.n-1))
		}
	}
	e.exp = from + d.ResetAfter.Microseconds()
	return d
}

// applyAdjust runs the adjustment of p's algorithm on the state in e (and log, for SlidingLog;
// rec, for TokenBucket) and sets when the state becomes idle. It reports whether the charge was
// capped.
func applyAdjust(e *entry, log *slidingLogState, rec *peaks, p params, at, charged, delta int64, now time.Time) (capped bool) {
	var reset, from int64
	ok := true
	switch p.alg {
	case algTokenBucket:
		var s tokenBucketState
		if s, reset, ok, capped = tokenBucketAdjust(tokenBucketState{e.s[0], e.s[1], e.s[2], recOf(rec)}, p, at, charged, delta, now); ok {
			e.s, from = [3]int64{s.Tokens, s.Last, s.Unit}, s.Last
			if rec != nil {
				*rec = s.Rec
			}
		}
	case algLeakyBucket:
		var s leakyBucketState
		if s, reset, ok, capped = leakyBucketAdjust(leakyBucketState{e.s[0], e.s[1], e.s[2]}, p, at, charged, delta, now); ok {
			e.s, from = [3]int64{s.Level, s.Last, s.Unit}, s.Last
		}
	case algGCRA:
		var s gcraState
		if s, reset, ok, capped = gcraAdjust(gcraState{e.s[0], e.s[1]}, p, at, charged, delta, now); ok {
			e.s, from = [3]int64{s.TAT, s.Frac}, micros(now)
		}
	case algFixedWindow:
		var s fixedWindowState
		if s, reset, ok, capped = fixedWindowAdjust(fixedWindowState{e.s[0], e.s[1]}, p, at, delta, now); ok {
			e.s, from = [3]int64{s.Start, s.Count}, max(micros(now), s.Start)
		}
	case algSlidingWindow:
		var s slidingWindowState
		if s, reset, ok, capped = slidingWindowAdjust(slidingWindowState{e.s[0], e.s[1], e.s[2]}, p, at, delta, now); ok {
			e.s, from = [3]int64{s.Start, s.Prev, s.Cur}, max(micros(now), s.Start)
		}
	case algSlidingLog:
		reset, from, capped = slidingLogAdjust(log, p, at, delta, now)
	}
	if ok {
		e.exp = from + reset
	}
	return capped
}

// shard is one independently locked part of a Memory store.
type shard struct {
	mu   sync.Mutex
	t    table
	over map[uint64]*entry // overflow states of the scopes whose hash chooses this shard
	_    [64]byte          // keeps the locks of neighbouring shards off one cache line
}
