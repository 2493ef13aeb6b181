package connect

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// A server that may evict keys is named, with the setting that lets it; noeviction, or no
// memory limit at all, is fine.
func TestCheckEviction(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.NewClient()
	t.Cleanup(func() { rdb.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	set := func(kv ...string) {
		t.Helper()
		for i := 0; i < len(kv); i += 2 {
			if err := rdb.ConfigSet(ctx, kv[i], kv[i+1]).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		maxmemory, policy string
		evicts            bool
	}{
		{"0", "allkeys-lru", false},
		{"100mb", "noeviction", false},
		{"100mb", "allkeys-lru", true},
		{"100mb", "volatile-ttl", true},
	} {
		set("maxmemory", tc.maxmemory, "maxmemory-policy", tc.policy)
		unchecked, err := CheckEviction(ctx, rdb)
		if len(unchecked) != 0 {
			t.Fatalf("%s/%s: unchecked %v", tc.maxmemory, tc.policy, unchecked)
		}
		if got := errors.Is(err, ErrEvicts); got != tc.evicts {
			t.Errorf("maxmemory %s, policy %s: CheckEviction = %v, want evicts %v", tc.maxmemory, tc.policy, err, tc.evicts)
		}
		if tc.evicts && (!strings.Contains(err.Error(), tc.policy) || !strings.Contains(err.Error(), srv.Addr)) {
			t.Errorf("error %q does not name the policy and the server", err)
		}
	}
}

// On a Redis Cluster every master is asked: one master that may evict is enough to refuse.
func TestCheckEvictionCluster(t *testing.T) {
	c := testenv.RedisCluster(t)
	rc := c.NewClient()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := CheckEviction(ctx, rc); err != nil {
		t.Fatalf("a fresh cluster: %v, want nil", err)
	}
	one := c.Nodes[len(c.Nodes)-1]
	node := one.NewClient()
	t.Cleanup(func() { node.Close() })
	for _, kv := range [][2]string{{"maxmemory", "64mb"}, {"maxmemory-policy", "allkeys-lfu"}} {
		if err := node.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	_, err := CheckEviction(ctx, rc)
	if !errors.Is(err, ErrEvicts) || !strings.Contains(err.Error(), one.Addr) {
		t.Errorf("one master with allkeys-lfu: %v, want ErrEvicts naming %s", err, one.Addr)
	}
}
