package connect

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// TestClusterClientFollowsFailover: a client of Redis for a cluster's seeds reaches the replica
// promoted after its master was SIGKILLed within a second of the promotion. go-redis alone
// asks the dead address until its slot map is a minute old (no MOVED comes from a dead node).
func TestClusterClientFollowsFailover(t *testing.T) {
	rc := testenv.RedisClusterReplicated(t, time.Second)
	rdb, err := Redis(rc.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	key := testenv.Prefix(t) + "{failover}"
	if err := rdb.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	master, replica := rc.Shard(t, key)
	rc.WaitReplicated(t, master)
	master.Stop()
	rc.Takeover(t, replica, key)
	promoted := time.Now()
	var calls int
	testenv.WaitFor(t, 10*time.Second, "a call to reach the promoted replica", func() bool {
		calls++
		return rdb.Get(ctx, key).Err() == nil
	})
	took := time.Since(promoted)
	t.Logf("the key was read again %v after the promotion, on call %d", took.Round(time.Millisecond), calls)
	if took > time.Second {
		t.Errorf("the client reached the promoted replica %v after the promotion, want within 1s", took)
	}
}
