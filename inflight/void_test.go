package inflight

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-rl/sluice/internal/testenv"
)

// TestRedisVoidsStalledAcquire (issue 39): an Acquire sent to a SIGSTOPped redis-server fails
// at its deadline, but the server runs it when it resumes and grants a place nobody holds.
// The store voids that lease: the place is gone within a second of SIGCONT, not at the end of
// its 10s hold, and a second Acquire of the cap of 1 gets it.
func TestRedisVoidsStalledAcquire(t *testing.T) {
	srv := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ReadTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	s := NewRedis(rdb, WithPrefix(prefix))
	t.Cleanup(func() { s.Close() })
	caps := []Cap{{Key: "v", Limit: 1}}
	// Load the script while the server answers, so the stalled call is one EVALSHA.
	first := ok(t)(s.Acquire(context.Background(), caps, 10*time.Second))
	if err := s.Release(context.Background(), first.Lease); err != nil {
		t.Fatal(err)
	}

	srv.Pause()
	if _, err := s.Acquire(context.Background(), caps, 10*time.Second); err == nil {
		t.Fatal("Acquire on a stopped server succeeded")
	}
	srv.Resume()
	resumed := time.Now()
	testenv.WaitFor(t, 5*time.Second, "the stalled acquire's place to be voided", func() bool {
		n, err := srv.Client.ZCard(context.Background(), prefix+"v").Result()
		return err == nil && n == 0
	})
	took := time.Since(resumed)
	t.Logf("the place granted after SIGCONT was voided %v after it (hold 10s)", took.Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("voided %v after SIGCONT, want within 1s", took)
	}
	res := ok(t)(s.Acquire(context.Background(), caps, 10*time.Second))
	if !res.Acquired {
		t.Fatalf("the cap of 1 is still full after the void: %+v", res)
	}
}

// TestReuserGivesBackAfterStall (issue 39): a place a Reuser kept goes back to the store after
// Idle; should Redis be stopped then (SIGSTOP), the give-back is tried again, and the place
// is free within a second of SIGCONT, not at the end of its 10s hold.
func TestReuserGivesBackAfterStall(t *testing.T) {
	srv := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ReadTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	s := NewRedis(rdb, WithPrefix(prefix))
	t.Cleanup(func() { s.Close() })
	r := Reuse(s, 0, 300*time.Millisecond)
	t.Cleanup(func() { r.Close(context.Background()) })
	caps := []Cap{{Key: "g", Limit: 2}}
	res := ok(t)(r.Acquire(context.Background(), caps, 10*time.Second))
	srv.Pause()
	if err := r.Release(context.Background(), res.Lease); err != nil { // kept: no round trip
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the stall, past Idle: the give-back fails meanwhile
	srv.Resume()
	resumed := time.Now()
	testenv.WaitFor(t, 5*time.Second, "the kept place given back", func() bool {
		n, err := srv.Client.ZCard(context.Background(), prefix+"g").Result()
		return err == nil && n == 0
	})
	took := time.Since(resumed)
	t.Logf("the kept place was given back %v after SIGCONT (hold 10s)", took.Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("given back %v after SIGCONT, want within 1s", took)
	}
}
