package limit

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// TestStoreResetNodeChanged: on a real three-node Redis Cluster, what a failover to a replica
// that missed the last writes leaves behind — the slot's epoch key naming another node, the
// key's state gone — is learned as a loss: a held rule's key that had used its limit is
// refused for the rest of its period, by this store (which knew the epoch) and by a new one
// (which did not: the key says the state was in use); the loss is reported once. A key made
// before nodes were recorded is adopted without a loss.
func TestStoreResetNodeChanged(t *testing.T) {
	c := testenv.RedisCluster(t)
	ctx := context.Background()
	var losses atomic.Int32
	prefix := testenv.Prefix(t)
	r := NewRedis(c.Client, RedisConfig{Prefix: prefix, OnLoss: func(string) { losses.Add(1) }})
	l := Limit{Algorithm: FixedWindow, Limit: 2, Period: time.Minute, OnReset: ResetConservative}
	_, ek, _ := r.epochs.group(r.key("a", algFixedWindow))
	if d, err := r.Decide(ctx, "a", l, 1); err != nil || !d.Allowed {
		t.Fatalf("first decision: %+v, %v", d, err)
	}
	if err := c.Client.HDel(ctx, ek, "node").Err(); err != nil {
		t.Fatal(err)
	}
	if d, err := r.Decide(ctx, "a", l, 1); err != nil || !d.Allowed {
		t.Fatalf("a decision after the node was dropped from the epoch key: %+v, %v; want allowed", d, err)
	}
	if node, _ := c.Client.HGet(ctx, ek, "node").Result(); node == "" || losses.Load() != 0 {
		t.Fatalf("the epoch key's node %q, losses %d; want adopted, none", node, losses.Load())
	}
	if err := c.Client.HSet(ctx, ek, "node", "0000000000000000000000000000000000000000").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Client.Del(ctx, r.key("a", algFixedWindow)).Err(); err != nil {
		t.Fatal(err)
	}
	fresh := NewRedis(c.NewClient(), RedisConfig{Prefix: prefix})
	for i, s := range []*Redis{fresh, r} {
		name := [...]string{"the new store", "the store"}[i]
		d, err := s.Decide(ctx, "a", l, 1)
		if err != nil || d.Allowed || d.RetryAfter <= 55*time.Second {
			t.Errorf("%s after the failover: %+v, %v; want refused for about a minute", name, d, err)
		}
	}
	if n := losses.Load(); n != 1 {
		t.Errorf("losses reported %d times, want 1", n)
	}
}
