package testenv

import (
	"context"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisClusterServer is a Redis Cluster of redis-server processes (three masters, with or
// without a replica each) started for a test on loopback.
type RedisClusterServer struct {
	// Nodes are the servers, masters and replicas as the cluster was created; Nodes[i].Addr
	// are the seeds.
	Nodes []*RedisServer
	// Client is a cluster client, closed at cleanup.
	Client *redis.ClusterClient
}

// RedisCluster starts a three-node Redis Cluster — redis-server --cluster-enabled yes three
// times, joined by redis-cli --cluster create — and stops it when the test ends. It skips the
// test (fails in strict mode) when redis-server or redis-cli is missing.
func RedisCluster(t testing.TB) *RedisClusterServer { return redisCluster(t, 0, 2*time.Second) }

// RedisClusterReplicated is RedisCluster with a replica for each of the three masters (six
// processes), nodeTimeout as cluster-node-timeout, and every replica in sync when it returns.
// Shard tells which node serves a key and which replicates it; Takeover promotes a replica.
func RedisClusterReplicated(t testing.TB, nodeTimeout time.Duration) *RedisClusterServer {
	return redisCluster(t, 1, nodeTimeout)
}

func redisCluster(t testing.TB, replicas int, nodeTimeout time.Duration) *RedisClusterServer {
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
	for range 3 * (1 + replicas) {
		s := &RedisServer{t: t, bin: bin, dir: t.TempDir()}
		var lastErr error
		for range 5 {
			s.Addr = "127.0.0.1:" + itoa(FreePort(t))
			s.args = []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", itoa(int(nodeTimeout.Milliseconds())), "--cluster-port", itoa(FreePort(t)),
				"--repl-diskless-sync-delay", "0"}
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
	args := append(c.Seeds(), "--cluster-replicas", itoa(replicas), "--cluster-yes")
	if out, err := exec.Command(cli, append([]string{"--cluster", "create"}, args...)...).CombinedOutput(); err != nil {
		unavailable(t, "redis-cli --cluster create: %v\n%s", err, out)
	}
	WaitFor(t, 30*time.Second, "the Redis Cluster to be ok on every node, every replica in sync", func() bool {
		for _, n := range c.Nodes {
			nc := redis.NewClient(&redis.Options{Addr: n.Addr, MaxRetries: -1})
			info, err := nc.ClusterInfo(context.Background()).Result()
			repl, err2 := nc.Info(context.Background(), "replication").Result()
			nc.Close()
			if err != nil || err2 != nil || !strings.Contains(info, "cluster_state:ok") ||
				strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") ||
				infoInt(repl, "connected_slaves:") < int64(replicas) && !strings.Contains(repl, "role:slave") {
				return false
			}
		}
		return true
	})
	c.Client = c.NewClient()
	return c
}

// Shard returns the node serving key's slot and, on a replicated cluster, its replica (nil
// on one without replicas), as the cluster's shards (CLUSTER SHARDS) say now.
func (c *RedisClusterServer) Shard(t testing.TB, key string) (master, replica *RedisServer) {
	t.Helper()
	ctx := context.Background()
	slot, err := c.Client.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatalf("testenv: CLUSTER KEYSLOT %q: %v", key, err)
	}
	// A replica that just joined may not be in the node's view of the shard yet (gossip):
	// asked again until it is, for up to 10 s, on a replicated cluster (more nodes than masters).
	for deadline := time.Now().Add(10 * time.Second); ; {
		nodes, err := shardOf(ctx, c.Client, slot)
		if err != nil {
			t.Fatalf("testenv: CLUSTER SHARDS: %v", err)
		}
		master, replica = nil, nil
		for _, n := range nodes {
			switch n.Role {
			case "master":
				master = c.node(t, nodeAddr(n))
			case "replica":
				replica = c.node(t, nodeAddr(n))
			}
		}
		if replica != nil || len(c.Nodes) <= 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if master == nil {
		t.Fatalf("testenv: no node serves the slot %d of %q", slot, key)
	}
	return master, replica
}

// shardOf returns the nodes of the shard that holds slot, as the node rdb asks says.
func shardOf(ctx context.Context, rdb redis.Cmdable, slot int64) ([]redis.Node, error) {
	shards, err := rdb.ClusterShards(ctx).Result()
	if err != nil {
		return nil, err
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if r.Start <= slot && slot <= r.End {
				return sh.Nodes, nil
			}
		}
	}
	return nil, nil
}

// nodeAddr is n's host:port.
func nodeAddr(n redis.Node) string { return net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10)) }

func (c *RedisClusterServer) node(t testing.TB, addr string) *RedisServer {
	for _, n := range c.Nodes {
		if n.Addr == addr {
			return n
		}
	}
	t.Fatalf("testenv: the cluster names a node %s it was not started with", addr)
	return nil
}

// Takeover promotes replica at once (CLUSTER FAILOVER TAKEOVER: no agreement of the other
// masters, as an operator or an orchestrator does when a master is dead) and returns once
// every running node's slot map gives it key's slot.
func (c *RedisClusterServer) Takeover(t testing.TB, replica *RedisServer, key string) {
	t.Helper()
	ctx := context.Background()
	rc := replica.NewClient()
	if err := rc.Do(ctx, "CLUSTER", "FAILOVER", "TAKEOVER").Err(); err != nil {
		t.Fatalf("testenv: CLUSTER FAILOVER TAKEOVER on %s: %v", replica.Addr, err)
	}
	slot, err := rc.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatalf("testenv: CLUSTER KEYSLOT %q: %v", key, err)
	}
	WaitFor(t, 20*time.Second, "every running node to route the slot to the promoted replica", func() bool {
		for _, n := range c.Nodes {
			if !n.running() {
				continue
			}
			nc := redis.NewClient(&redis.Options{Addr: n.Addr, MaxRetries: -1})
			nodes, err := shardOf(ctx, nc, slot)
			nc.Close()
			if err != nil || !slices.ContainsFunc(nodes, func(n redis.Node) bool {
				return n.Role == "master" && nodeAddr(n) == replica.Addr
			}) {
				return false
			}
		}
		return true
	})
}

// WaitReplicated returns once master's replicas have every write master accepted before the
// call.
func (c *RedisClusterServer) WaitReplicated(t testing.TB, master *RedisServer) {
	t.Helper()
	mc := master.NewClient()
	ctx := context.Background()
	info, err := mc.Info(ctx, "replication").Result()
	if err != nil {
		t.Fatalf("testenv: INFO replication on %s: %v", master.Addr, err)
	}
	want := infoInt(info, "master_repl_offset:")
	WaitFor(t, 5*time.Second, "the replicas to have every write made so far", func() bool {
		info, err := mc.Info(ctx, "replication").Result()
		if err != nil {
			return false
		}
		n := 0
		for _, line := range strings.Split(info, "\n") {
			if strings.HasPrefix(line, "slave") && strings.Contains(line, "offset=") {
				_, off, _ := strings.Cut(line, "offset=")
				off, _, _ = strings.Cut(off, ",")
				if o, _ := strconv.ParseInt(off, 10, 64); o < want {
					return false
				}
				n++
			}
		}
		return n > 0
	})
}

// StallReplication waits until master's replicas have every write master accepted before the
// call, then drops every packet of its replication stream to them (an iptables rule on the
// stream's ports, until the test ends): the replicas stay at what they had, and nothing tells
// them or the master, as when the link between them is partitioned. The writes the master
// accepts from then on are the ones a failover to a replica loses. Call NeedBlackHole first.
func (c *RedisClusterServer) StallReplication(t testing.TB, master *RedisServer) {
	t.Helper()
	c.WaitReplicated(t, master)
	mc := master.NewClient()
	list, err := mc.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatalf("testenv: CLIENT LIST on %s: %v", master.Addr, err)
	}
	_, port, _ := splitHostPort(master.Addr)
	n := 0
	for _, line := range strings.Split(list, "\n") {
		if !strings.Contains(line, " flags=S ") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if addr, ok := strings.CutPrefix(f, "addr="); ok {
				_, rport, _ := splitHostPort(addr)
				dropPackets(t, "-p", "tcp", "--sport", port, "--dport", rport)
				n++
			}
		}
	}
	if n == 0 {
		t.Fatalf("testenv: %s has no replica connected", master.Addr)
	}
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

// infoInt reads the integer after name (e.g. "master_repl_offset:") in an INFO reply; 0 when
// absent.
func infoInt(info, name string) int64 {
	_, v, ok := strings.Cut(info, name)
	if !ok {
		return 0
	}
	v, _, _ = strings.Cut(v, "\r")
	n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	return n
}
