package testenv

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisClusterServer is a Redis Cluster of three redis-server processes (masters, no replicas)
// started for a test on loopback.
type RedisClusterServer struct {
	// Nodes are the servers; Nodes[i].Addr are the seeds.
	Nodes []*RedisServer
	// Client is a cluster client, closed at cleanup.
	Client *redis.ClusterClient
}

// RedisCluster starts a three-node Redis Cluster — redis-server --cluster-enabled yes three
// times, joined by redis-cli --cluster create — and stops it when the test ends. It skips the
// test (fails in strict mode) when redis-server or redis-cli is missing.
func RedisCluster(t testing.TB) *RedisClusterServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		unavailable(t, "redis-server not found in PATH (install: apt-get install -y redis-server)")
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		unavailable(t, "redis-cli not found in PATH (install: apt-get install -y redis-tools)")
	}
	c := &RedisClusterServer{}
	for range 3 {
		s := &RedisServer{t: t, bin: bin, dir: t.TempDir()}
		var lastErr error
		for range 5 {
			s.Addr = "127.0.0.1:" + itoa(FreePort(t))
			s.args = []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", "2000", "--cluster-port", itoa(FreePort(t))}
			if lastErr = s.start(); lastErr == nil {
				break
			}
		}
		if lastErr != nil {
			unavailable(t, "start redis-server (cluster node): %v", lastErr)
		}
		t.Cleanup(s.shutdown)
		c.Nodes = append(c.Nodes, s)
	}
	args := append(c.Seeds(), "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, append([]string{"--cluster", "create"}, args...)...).CombinedOutput(); err != nil {
		unavailable(t, "redis-cli --cluster create: %v\n%s", err, out)
	}
	WaitFor(t, 20*time.Second, "the Redis Cluster to be ok on every node", func() bool {
		for _, n := range c.Nodes {
			nc := redis.NewClient(&redis.Options{Addr: n.Addr, MaxRetries: -1})
			info, err := nc.ClusterInfo(context.Background()).Result()
			nc.Close()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false
			}
		}
		return true
	})
	c.Client = c.NewClient()
	return c
}

// Seeds returns the nodes' host:port addresses.
func (c *RedisClusterServer) Seeds() []string {
	var out []string
	for _, n := range c.Nodes {
		out = append(out, n.Addr)
	}
	return out
}

// URL returns the cluster's redis.url: its seeds, separated by commas.
func (c *RedisClusterServer) URL() string { return "redis://" + strings.Join(c.Seeds(), ",") }

// NewClient returns a new cluster client; the test's cleanup closes it.
func (c *RedisClusterServer) NewClient() *redis.ClusterClient {
	rc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Seeds(), MaxRetries: 3})
	c.Nodes[0].t.Cleanup(func() { rc.Close() })
	return rc
}
