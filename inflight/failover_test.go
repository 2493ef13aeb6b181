package inflight

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// TestFenceNodeChanged: on a Redis Cluster, a group's epoch key records the node that made it.
// A failover to a replica that got the key but not the last places is played on a real
// three-node cluster by what it leaves behind: the key names another node, and the places are
// gone. Then every caller is fenced, a store that never knew the epoch included (the key says
// places may be in use); the holder re-asserts its 5 places; the two stores that knew the
// epoch report one loss each, the newcomer none. A key made before nodes were recorded is
// adopted without a fence.
func TestFenceNodeChanged(t *testing.T) {
	rc := testenv.RedisCluster(t)
	ctx := context.Background()
	const hold, margin = 3 * time.Second, time.Second
	la, lb, lc := &losses{}, &losses{}, &losses{}
	prefix := testenv.Prefix(t)
	store := func(l *losses) *Redis {
		s := NewRedis(rc.NewClient(), WithPrefix(prefix), WithMargin(margin), l.option())
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b := store(la), store(lb)
	caps := []Cap{{Key: "{f}:q", Limit: 5}}
	ek, ok1 := a.epochKey(prefix + "{f}:q")
	if !ok1 {
		t.Fatal("no epoch key for {f}:q")
	}

	// A key without the node (made by an older Sluice) is adopted, not fenced.
	ok(t)(a.Acquire(ctx, caps, hold))
	if err := rc.Client.HDel(ctx, ek, "node").Err(); err != nil {
		t.Fatal(err)
	}
	var held []Lease
	for range 4 {
		r := ok(t)(a.Acquire(ctx, caps, hold))
		if !r.Acquired {
			t.Fatalf("a place refused after the node was dropped from the epoch key: %+v", r)
		}
		held = append(held, r.Lease)
	}
	if node, _ := rc.Client.HGet(ctx, ek, "node").Result(); node == "" {
		t.Fatal("the epoch key did not get its node back")
	}
	if r := ok(t)(b.Acquire(ctx, caps, hold)); r.Acquired { // b learns the epoch
		t.Fatal("a sixth place granted")
	}

	// The failover: the key now names another node, and the places are gone.
	if err := rc.Client.HSet(ctx, ek, "node", "0000000000000000000000000000000000000000").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.Client.Del(ctx, prefix+"{f}:q").Err(); err != nil {
		t.Fatal(err)
	}
	c := store(lc)
	r := ok(t)(c.Acquire(ctx, caps, hold))
	if r.Acquired || r.RetryAfter < hold-margin-200*time.Millisecond || r.RetryAfter > hold-margin {
		t.Fatalf("a new store's first Acquire after the failover: %+v; want refused for the fence of %v", r, hold-margin)
	}
	if r := ok(t)(a.Acquire(ctx, caps, hold)); r.Acquired || r.RetryAfter <= 0 {
		t.Fatalf("the holder's first Acquire after the failover: %+v; want refused by the fence", r)
	}
	if n := inFlight(t, c, "{f}:q"); n[0] != 5 {
		t.Fatalf("in flight after the holder re-asserted its places: %v, want 5", n)
	}
	if r := ok(t)(b.Acquire(ctx, caps, hold)); r.Acquired {
		t.Fatalf("b was granted a place after the failover: %+v", r)
	}
	if la.n.Load() != 1 || lb.n.Load() != 1 || lc.n.Load() != 0 {
		t.Fatalf("losses reported: a %d, b %d, c %d; want 1, 1, 0", la.n.Load(), lb.n.Load(), lc.n.Load())
	}
	// The node that serves the key now is recorded: the next calls are not fenced again.
	for _, l := range held[:2] {
		if err := a.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, hold, "a place once the fence has passed", func() bool {
		r, err := c.Acquire(ctx, caps, hold)
		return err == nil && r.Acquired && r.InFlight[0] <= 5
	})
	if la.n.Load()+lb.n.Load()+lc.n.Load() != 2 {
		t.Fatalf("losses reported after the fence: a %d, b %d, c %d; want no more", la.n.Load(), lb.n.Load(), lc.n.Load())
	}
}

// BenchmarkAcquireReleaseCluster: a place's life (Acquire, then Release) on a three-node Redis
// Cluster, with the epoch key's node check (CLUSTER MYID in each Acquire) and without it.
// server-µs/op is the time the server spent in the two scripts (INFO commandstats, EVALSHA
// and EVAL), which a loaded machine's round trips do not blur. Run it with
//
//	go test -run '^$' -bench AcquireReleaseCluster -benchtime 5000x -count 3 ./inflight/
func BenchmarkAcquireReleaseCluster(b *testing.B) {
	rc := testenv.RedisCluster(b)
	ctx := context.Background()
	for _, check := range []bool{false, true} {
		name := map[bool]string{false: "no-node-check", true: "node-check"}[check]
		b.Run(name, func(b *testing.B) {
			s := NewRedis(rc.NewClient(), WithPrefix(testenv.Prefix(b)))
			defer s.Close()
			if !check {
				s.cluster = "0"
			}
			caps := []Cap{{Key: "{b}:one", Limit: 1 << 30}}
			ok(b)(s.Acquire(ctx, caps, time.Minute)) // loads the script, makes the epoch
			if err := rc.Client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
				return m.ConfigResetStat(ctx).Err()
			}); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				r := ok(b)(s.Acquire(ctx, caps, time.Minute))
				if err := s.Release(ctx, r.Lease); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			var usec atomic.Int64
			if err := rc.Client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
				stats, err := m.Info(ctx, "commandstats").Result()
				for _, line := range strings.Split(stats, "\n") {
					if strings.HasPrefix(line, "cmdstat_evalsha:") || strings.HasPrefix(line, "cmdstat_eval:") {
						_, v, _ := strings.Cut(line, "usec=")
						v, _, _ = strings.Cut(v, ",")
						n, _ := strconv.ParseInt(v, 10, 64)
						usec.Add(n)
					}
				}
				return err
			}); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(usec.Load())/float64(b.N), "server-µs/op")
		})
	}
}
