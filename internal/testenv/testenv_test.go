package testenv

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

func TestRedisStopStart(t *testing.T) {
	s := Redis(t)
	ctx := context.Background()
	if err := s.Client.Set(ctx, Prefix(t)+"k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	ctx2, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := s.Client.Ping(ctx2).Err(); err == nil {
		t.Fatal("ping succeeded after Stop")
	}
	// The stopped server's address stays taken, so that no other test's server gets it.
	if l, err := net.Listen("tcp", s.Addr); err == nil {
		l.Close()
		t.Fatal("a stopped server's address could be taken")
	}
	s.Start()
	if err := s.Client.Ping(ctx).Err(); err != nil {
		t.Fatalf("ping after Start: %v", err)
	}
	if n, _ := s.Client.Exists(ctx, Prefix(t)+"k").Result(); n != 0 {
		t.Fatal("restarted server kept data; persistence should be off")
	}
}

func TestNATSEmbedded(t *testing.T) {
	s := NATS(t)
	nc := Connect(t, s.URL)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	name := Name(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, name, []byte("x")); err != nil {
		t.Fatal(err)
	}
}

func TestNATSProcessSurvivesKill(t *testing.T) {
	p := NATSProc(t)
	nc := Connect(t, p.URL)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	name := Name(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, name, []byte("x")); err != nil {
		t.Fatal(err)
	}
	p.Kill()
	p.Start()
	WaitFor(t, 10*time.Second, "stream to come back with its message", func() bool {
		st, err := js.Stream(ctx, name)
		if err != nil {
			return false
		}
		info, err := st.Info(ctx)
		return err == nil && info.State.Msgs == 1
	})
}

func TestRedisCluster(t *testing.T) {
	c := RedisCluster(t)
	ctx := context.Background()
	// Keys in different slots land on different nodes, and the cluster client routes them.
	for i := range 50 {
		if err := c.Client.Set(ctx, "k"+itoa(i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	used := 0
	for _, n := range c.Nodes {
		if n.Client == nil {
			n.Client = n.NewClient()
		}
		if size, _ := n.Client.DBSize(ctx).Result(); size > 0 {
			used++
		}
	}
	if used != 3 {
		t.Fatalf("keys on %d nodes, want 3", used)
	}
}

// TestRedisClusterTakeover: on a replicated cluster, a write made after StallReplication is
// not on the replica, which Takeover promotes once the master is killed: the failover loses
// exactly the writes made after the stall.
func TestRedisClusterTakeover(t *testing.T) {
	NeedBlackHole(t)
	c := RedisClusterReplicated(t, time.Second)
	ctx := context.Background()
	key := Prefix(t) + "{k}"
	if err := c.Client.Set(ctx, key, "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	master, replica := c.Shard(t, key)
	if replica == nil {
		t.Fatal("no replica for the key's slot")
	}
	c.StallReplication(t, master)
	if err := c.Client.Set(ctx, key, "after", 0).Err(); err != nil {
		t.Fatal(err)
	}
	master.Stop()
	start := time.Now()
	rc := replica.NewClient()
	c.Takeover(t, replica, key)
	promoted := time.Since(start)
	v, err := rc.Get(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if v != "before" {
		t.Errorf("the promoted replica has %q, want the value from before the stall", v)
	}
	t.Logf("promoted in %v", promoted.Round(time.Millisecond))
}
