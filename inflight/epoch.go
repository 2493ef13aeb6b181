package inflight

import (
	"context"
	"crypto/rand"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Redis server can lose the places it holds while their holders still use them: a restart
// without persistence, a failover to a replica that had not got them, a FLUSHALL. Each group
// of caps (the caps of one hash tag) has an epoch key in its slot, made at the group's first
// use; every script checks it against the epoch the calling store knows (one HMGET, no round
// trip more), so that a store that knew an epoch and finds none, or another, learns of the
// loss. The script then sets the group's fence: no place is granted until the epoch's birth
// plus fenceFor(hold), by when every place taken before the loss is out of use. The store
// re-asserts the places it still holds (reassert.lua), which are then counted when the fence
// ends. On a Redis Cluster the key also names the node that made it (CLUSTER MYID): a replica
// promoted after a failover has the key but perhaps not the last places, and the first script
// it runs for the group makes a new epoch, fenced, as for a lost key. epoch.lua and
// docs/design/inflight.md have the details.

var (
	//go:embed lua/epoch.lua
	epochLua string

	//go:embed lua/reassert.lua
	reassertLua    string
	reassertScript = redis.NewScript(epochLua + reassertLua)
)

// WithMargin sets how much of each hold given to the store is margin (for clocks and round
// trips) beyond the longest a holder uses a place after taking it: after a loss of state the
// fence lasts hold − margin from the new epoch's birth (hold itself when margin ≥ hold).
// Default 0: the fence lasts the whole hold.
func WithMargin(d time.Duration) RedisOption {
	return func(r *Redis) {
		if d > 0 {
			r.margin = d
		}
	}
}

// WithOnLoss sets a function the store calls once per loss of state it learns of, per group
// of caps, with the key of the cap whose call learned it; a metric and a log line go there.
// It runs on the goroutine of that call and must not block.
func WithOnLoss(f func(key string)) RedisOption { return func(r *Redis) { r.onLoss = f } }

// group is what a store knows of one group of caps (one epoch key). Guarded by Redis.gmu.
type group struct {
	epoch string    // the epoch last seen, "" for none
	valid time.Time // the epoch key exists on the server until then at least, barring a loss
	// leases are the leases of the group this store gave out and were not released.
	leases map[string]*out
	// stale is set when a loss was learned and not every lease has been re-asserted since.
	stale bool
}

// out is a lease a store gave out.
type out struct {
	keys    []string      // its Redis keys
	hold    time.Duration // the hold it was taken or last renewed for
	expires time.Time     // when the store frees it at the latest (local clock)
	epoch   string        // the epoch it was taken under, or re-asserted in
}

// epochKey returns the epoch key of the group of the Redis key key, in key's slot:
// prefix + "{tag}:epoch" where tag is key's hash tag, or key itself when it has none. ok is
// false when no such key is in key's slot (a key without a tag that holds a '}'): its caps
// are then not fenced.
func (r *Redis) epochKey(key string) (ek string, ok bool) {
	tag := key
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			tag = key[s+1 : s+1+e]
		}
	}
	ek = r.prefix + "{" + tag + "}:epoch"
	if tag == key && strings.IndexByte(key, '}') >= 0 || strings.IndexByte(r.prefix, '{') >= 0 && Slot(ek) != Slot(key) {
		return "", false
	}
	return ek, true
}

// fenceFor is how long after a loss no place is granted, for places of hold.
func (r *Redis) fenceFor(hold time.Duration) time.Duration {
	if r.margin > 0 && r.margin < hold {
		return hold - r.margin
	}
	return hold
}

// known returns the epoch this store knows of the group ek, "" when none or when its
// knowledge has lapsed (no lease out, and the key may have expired since).
func (r *Redis) known(ek string, now time.Time) string {
	r.gmu.Lock()
	defer r.gmu.Unlock()
	g := r.groups[ek]
	if g == nil {
		return ""
	}
	if len(g.leases) == 0 && !now.Before(g.valid) {
		g.epoch = ""
	}
	return g.epoch
}

// groupLocked returns the group ek, made when missing. r.gmu is held. Groups with no lease
// out whose knowledge has lapsed are swept each time their number has doubled.
func (r *Redis) groupLocked(ek string, now time.Time) *group {
	g := r.groups[ek]
	if g != nil {
		return g
	}
	if r.groups == nil {
		r.groups = map[string]*group{}
	}
	if len(r.groups) >= r.sweepAt {
		for k, o := range r.groups {
			for id, l := range o.leases {
				if !now.Before(l.expires) {
					delete(o.leases, id)
				}
			}
			if len(o.leases) == 0 && !now.Before(o.valid) {
				delete(r.groups, k)
			}
		}
		r.sweepAt = max(minSweep, 2*len(r.groups))
	}
	g = &group{leases: map[string]*out{}}
	r.groups[ek] = g
	return g
}

// newer reports whether epoch a was born after epoch b ("<born µs>:<random>").
func newer(a, b string) bool {
	born := func(e string) int64 {
		i := strings.IndexByte(e, ':')
		if i < 0 {
			return 0
		}
		n, _ := strconv.ParseInt(e[:i], 10, 64)
		return n
	}
	return born(a) > born(b)
}

// seeLocked records that the server answered with epoch got; r.gmu is held. It reports
// whether that tells this store of a loss (it knew another, older epoch).
func (g *group) seeLocked(got string) (lost bool) {
	if got == "" || got == g.epoch || g.epoch != "" && newer(g.epoch, got) {
		return false // the same, or an answer from before a loss this store knows of
	}
	lost = g.epoch != ""
	g.epoch = got
	if lost {
		g.stale = true
	}
	return lost
}

// saw records the epoch got of the group ek from an answer to a call started at start for
// hold, about cap key key, and the lease it gave out (took, nil for none). When the store
// learns of a loss it calls onLoss, and re-asserts the leases it holds of the group.
func (r *Redis) saw(ctx context.Context, ek, key, got string, start time.Time, hold time.Duration, id string, took *out) {
	r.gmu.Lock()
	g := r.groupLocked(ek, start)
	lost := g.seeLocked(got)
	if got == g.epoch {
		if v := start.Add(hold); v.After(g.valid) {
			g.valid = v
		}
	}
	if took != nil {
		g.leases[id] = took
		if took.epoch != g.epoch {
			g.stale = true // taken before a loss that another call learned of meanwhile
		}
	}
	stale := g.stale
	r.gmu.Unlock()
	if lost && r.onLoss != nil {
		r.onLoss(key)
	}
	if stale {
		r.reassert(ctx, ek, key)
	}
}

// reassert puts back, in the server, the leases of group ek this store holds that were taken
// under an older epoch, while the fence after the loss stands; once it is over they are given
// up (their holders' Renew reports false, their Release does nothing). Leases released while
// they were being put back are released again. On an error the group stays stale, and the
// next call of the group tries again.
func (r *Redis) reassert(ctx context.Context, ek, key string) {
	for range 4 {
		r.gmu.Lock()
		g := r.groups[ek]
		if g == nil {
			r.gmu.Unlock()
			return
		}
		now := time.Now()
		var (
			old   string
			ids   []string
			lks   [][]string // the keys of each lease of ids, as callers know them
			keys  = []string{ek}
			args  = []any{"", int64(0), rand.Text(), int64(0), r.cluster}
			most  time.Duration
			fence time.Duration
		)
		for id, o := range g.leases {
			left := o.expires.Sub(now)
			if left <= 0 {
				delete(g.leases, id)
				continue
			}
			if o.epoch == g.epoch || old != "" && o.epoch != old {
				continue
			}
			old = o.epoch
			ids = append(ids, id)
			lks = append(lks, unprefixed(o.keys, r.prefix))
			keys = append(keys, o.keys...)
			args = append(args, id, micros(left), len(o.keys))
			most, fence = max(most, left), max(fence, r.fenceFor(o.hold))
		}
		if len(ids) == 0 {
			g.stale = false
			r.gmu.Unlock()
			return
		}
		r.gmu.Unlock()
		args[0], args[1], args[3] = old, micros(fence), micros(most)
		v, err := reassertScript.Run(ctx, r.rdb, keys, args...).Slice()
		ok, cur, err := parseStatus(v, err)
		if err != nil {
			return
		}
		var again []Lease
		r.gmu.Lock()
		lost := g.seeLocked(cur)
		for i, id := range ids {
			o := g.leases[id]
			switch {
			case o == nil && ok == 1: // released meanwhile: the place put back is free
				again = append(again, Lease{ID: id, Keys: lks[i]})
			case o == nil:
			case ok == 1:
				o.epoch = cur
			default: // the fence is over: the place is out of use, given up
				delete(g.leases, id)
			}
		}
		r.gmu.Unlock()
		if lost && r.onLoss != nil {
			r.onLoss(key)
		}
		for _, l := range again {
			_ = r.Release(ctx, l)
		}
	}
}

// unprefixed returns keys without prefix: the keys as callers know them.
func unprefixed(keys []string, prefix string) []string {
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, strings.TrimPrefix(k, prefix))
	}
	return out
}

// parseStatus reads a script's {status, epoch} answer.
func parseStatus(v []any, err error) (int64, string, error) {
	if err != nil {
		return 0, "", err
	}
	if len(v) != 2 {
		return 0, "", fmt.Errorf("script returned %d values, want 2", len(v))
	}
	s, ok1 := v[0].(int64)
	e, ok2 := v[1].(string)
	if !ok1 || !ok2 {
		return 0, "", fmt.Errorf("script returned %T, %T", v[0], v[1])
	}
	return s, e, nil
}

// micros is d in µs, rounded up.
func micros(d time.Duration) int64 { return int64((d + time.Microsecond - 1) / time.Microsecond) }
