package limit

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// A Redis server can lose the rule state it holds: a restart without persistence, a FLUSHALL,
// a failover to a replica that had not got the latest writes. A lost state reads as no state,
// which every algorithm takes for a key that has used nothing: left alone, a key that had used
// its limit gets it whole again at once. So every decision script first checks an epoch key
// (lua/epoch.lua) against the epoch this store last saw, in the same round trip: one per store
// on a single Redis, one per hash slot on a Redis Cluster (the script's keys must share a
// slot), made at first use and never expiring (a hash of ~100 bytes; at most 16 384 of them on
// a cluster). A store that knew an epoch and finds none, or another, has learned of a loss:
// the script records when (the key's "lost" field, seen by every process), and limits with
// OnReset ResetConservative refuse every request for their reset hold after it. On a Redis
// Cluster the epoch key also records the node that made it (CLUSTER MYID, in the same script):
// a key found on another node came with a failover, whose promoted replica may have missed the
// last writes, or with a slot's migration, and is taken for a loss too. RedisConfig.OnLoss
// reports each loss a store learns of. docs/store-reset.md says what each algorithm admits.

// ResetMode is what a limit decided by the Redis store admits after the store learned that
// Redis lost its state (config on_store_reset). The zero value is ResetFresh.
type ResetMode string

// The reset modes. Their names are the values accepted in the config file.
const (
	// ResetFresh lets the algorithm start afresh, as for a key never seen: a key gets its
	// whole capacity again at once.
	ResetFresh ResetMode = "allow"
	// ResetConservative refuses every request of the limit (RetryAfter: the rest of the
	// reset hold) until the reset hold has passed since the loss was learned: the time the limit
	// takes to become whole from empty, Period for the window algorithms and
	// Capacity × Period / Limit for the buckets and GCRA. A key then starts afresh, as it
	// would have been whole by then anyway unless it owed debt.
	ResetConservative ResetMode = "hold"
)

// Valid reports whether m is a known mode ("" is ResetFresh).
func (m ResetMode) Valid() bool { return m == "" || m == ResetFresh || m == ResetConservative }

// ResetHold is how long after a loss of the store's state l refuses every request, in µs: 0
// unless l.OnReset is ResetConservative, else the time l takes to become whole from empty,
// rounded up (0 for an invalid limit).
func (l Limit) ResetHold() int64 {
	if l.OnReset != ResetConservative {
		return 0
	}
	p, err := l.cachedParams()
	if err != nil {
		return 0
	}
	return p.resetHold()
}

// resetHold is the µs a limit of p takes to become whole from empty.
func (p params) resetHold() int64 {
	switch p.alg {
	case algTokenBucket, algLeakyBucket, algGCRA:
		return cdiv(p.cap, p.refill)
	default:
		return p.period
	}
}

// cdiv returns ceil(a / b) for a >= 0, b > 0.
func cdiv(a, b int64) int64 { return (a + b - 1) / b }

// epochs is what a Redis store knows of the epochs of its groups of state. Safe for
// concurrent use.
type epochs struct {
	cluster bool
	flag    int64 // the scripts' last ARGV: 1 on a Redis Cluster (epoch keys record their node), else 0
	prefix  string
	single  string         // the epoch key on a single Redis: prefix + "epoch"
	known   []atomic.Int64 // by group: 1 on a single Redis, a hash slot's on a cluster
	onLoss  func(key string)
}

func newEpochs(rdb RedisClient, prefix string, onLoss func(string)) *epochs {
	e := &epochs{prefix: prefix, single: prefix + "epoch", onLoss: onLoss}
	if _, ok := rdb.(*redis.ClusterClient); ok {
		e.cluster, e.flag = true, 1
		e.known = make([]atomic.Int64, hashSlots)
	} else {
		e.known = make([]atomic.Int64, 1)
	}
	return e
}

// group returns the group of the Redis key k, its epoch key and the epoch known of it (0:
// none), the script's last ARGV but two.
func (e *epochs) group(k string) (int, string, int64) {
	if !e.cluster {
		return 0, e.single, e.known[0].Load()
	}
	s := hashSlot(k)
	return s, e.prefix + "{" + hashSlotTag(s) + "}:epoch", e.known[s].Load()
}

// saw records that a script called with the epoch known of group g, about key, answered id;
// a store that knew an epoch learns of a loss when the answer is another one. Each loss is
// reported once per store and group.
func (e *epochs) saw(g int, known, id int64, key string) {
	if id == 0 || id == known || !e.known[g].CompareAndSwap(known, id) {
		return
	}
	if known != 0 && e.onLoss != nil {
		e.onLoss(key)
	}
}

// hashSlots is the number of hash slots of a Redis Cluster.
const hashSlots = 16384

// slot returns the Redis Cluster hash slot of key (CRC16 of its hash tag, or of key).
func hashSlot(key string) int {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc % hashSlots)
}

var (
	hashSlotTagsOnce sync.Once
	hashSlotTags     []string // hashSlotTags[s] is a short hash tag in slot s
)

// hashSlotTag returns a short hash tag whose slot is s: the first decimal number in it, found for
// every slot at once (about 170 000 CRCs, a few ms) the first time a cluster store needs one.
func hashSlotTag(s int) string {
	hashSlotTagsOnce.Do(func() {
		hashSlotTags = make([]string, hashSlots)
		for left, n := hashSlots, 0; left > 0; n++ {
			t := strconv.Itoa(n)
			if i := hashSlot(t); hashSlotTags[i] == "" {
				hashSlotTags[i], left = t, left-1
			}
		}
	})
	return hashSlotTags[s]
}
