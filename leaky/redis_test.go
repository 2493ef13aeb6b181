package leaky

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-rl/sluice/internal/testenv"
)

// TestRedisKey: one hash per queue, hash-tagged whole so the scripts run on Redis Cluster, which
// expires once it no longer matters.
func TestRedisKey(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	prefix := testenv.Prefix(t)
	s := NewRedis(srv.Client, RedisConfig{Prefix: prefix})
	if _, err := s.Take(ctx, "orders", Rate{Interval: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Take(ctx, "orders", Rate{Interval: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	key := "{" + prefix + "leak:orders}"
	fields, err := srv.Client.HGetAll(ctx, key).Result()
	if err != nil || fields["last"] == "" || fields["epoch"] == "" {
		t.Fatalf("HGETALL %s = %v, %v; want last and epoch", key, fields, err)
	}
	// The next TAT is 20s away; the state lives until then plus a minute.
	ttl, err := srv.Client.PTTL(ctx, key).Result()
	if err != nil || ttl < 79*time.Second || ttl > 80*time.Second {
		t.Fatalf("PTTL %v, %v; want about 80s", ttl, err)
	}
	// A long pause keeps the state until it is over (plus its burst recovery and slack).
	if err := s.Pause(ctx, "orders", time.Hour); err != nil {
		t.Fatal(err)
	}
	ttl, err = srv.Client.PTTL(ctx, key).Result()
	if err != nil || ttl < time.Hour+59*time.Second || ttl > time.Hour+60*time.Second {
		t.Fatalf("PTTL after Pause(1h) %v, %v; want about 1h1m", ttl, err)
	}
	// The default prefix.
	d := NewRedis(srv.Client, RedisConfig{})
	if got := d.key("orders"); got != "{sluice:leak:orders}" {
		t.Fatalf("default key %q", got)
	}
}

// TestRedisScriptCacheFlushed: EVALSHA falls back to EVAL when the server forgot the scripts.
func TestRedisScriptCacheFlushed(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	s := NewRedis(srv.Client, RedisConfig{Prefix: testenv.Prefix(t)})
	take(t, s, "q", perSecond10)
	if err := srv.Client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if w := take(t, s, "q", perSecond10); w <= 0 || w > 100*time.Millisecond {
		t.Fatalf("wait after SCRIPT FLUSH %v, want (0, 100ms]", w)
	}
	if _, err := s.PausedFor(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(ctx, "q", time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestRedisServerTime: without the test clock the scripts use the server's TIME, and waits are
// relative to it.
func TestRedisServerTime(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	s := NewRedis(srv.Client, RedisConfig{Prefix: testenv.Prefix(t)})
	r := Rate{Interval: time.Hour}
	if w := take(t, s, "q", r); w != 0 {
		t.Fatalf("first wait %v", w)
	}
	before := time.Now()
	slot, err := s.Take(ctx, "q", r)
	if err != nil {
		t.Fatal(err)
	}
	// The second slot is an hour after the first, less the time between the two takes.
	if slot.Wait > time.Hour || slot.Wait < time.Hour-time.Since(before)-time.Second {
		t.Fatalf("second wait %v, want just under 1h", slot.Wait)
	}
	if d := slot.At.Sub(time.Now().Add(slot.Wait)); d > 0 || d < -time.Second {
		t.Fatalf("At %v is not about now+Wait", slot.At)
	}
	if err := s.Pause(ctx, "q", 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	p, err := s.PausedFor(ctx, "q")
	if err != nil || p > 2*time.Hour || p < 2*time.Hour-time.Second {
		t.Fatalf("PausedFor %v, %v; want just under 2h", p, err)
	}
}

// TestRedisAggregateRate is the accuracy goal: workers in separate "processes" (two clients, 8
// goroutines each) with a backlog deliver at the rate within 1%, never above it.
func TestRedisAggregateRate(t *testing.T) {
	srv := testenv.Redis(t)
	const rate = 200
	r := Rate{Interval: time.Second / rate}
	prefix := testenv.Prefix(t)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()

	var (
		mu    sync.Mutex
		times []time.Time
		wg    sync.WaitGroup
	)
	for range 2 {
		s := NewRedis(srv.NewClient(), RedisConfig{Prefix: prefix})
		for range 8 {
			wg.Go(func() {
				for {
					if err := Wait(ctx, s, "q", r, nil); err != nil {
						if ctx.Err() == nil {
							t.Errorf("Wait: %v", err)
						}
						return
					}
					now := time.Now()
					mu.Lock()
					times = append(times, now)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	if len(times) < 2 {
		t.Fatalf("only %d deliveries", len(times))
	}

	// Total: slots are Interval apart, so over [first, last] there are rate×elapsed + 1.
	elapsed := times[len(times)-1].Sub(times[0])
	want := float64(rate)*elapsed.Seconds() + 1
	got := float64(len(times))
	if tol := 0.01*float64(rate)*elapsed.Seconds() + 2; got < want-tol || got > want+tol {
		t.Errorf("%d deliveries in %v, want %.1f ± %.1f", len(times), elapsed, want, tol)
	}

	// Never above the rate: no 1-second window holds more than rate + burst slots, plus one: a
	// delivery is observed a little after its slot (the reply's trip back, the wake-up), by
	// varying amounts less than one interval, so a window can catch one slot from before its
	// start but not two.
	maxIn := 0
	for i := range times {
		j, _ := slices.BinarySearchFunc(times[i:], times[i].Add(time.Second), func(a, b time.Time) int { return a.Compare(b) })
		maxIn = max(maxIn, j)
	}
	if limit := rate + int(r.Burst) + 1; maxIn > limit {
		t.Errorf("a 1s window holds %d deliveries, more than %d", maxIn, limit)
	}
	t.Logf("%d deliveries in %v (%.2f/s); busiest 1s window %d", len(times), elapsed, got/elapsed.Seconds(), maxIn)
}

// TestRedisDown: with Redis down a take fails promptly; after a restart takes work again with a
// fresh schedule, and reservations made before the restart are void.
func TestRedisDown(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	s := NewRedis(client, RedisConfig{Prefix: testenv.Prefix(t)})
	r := Rate{Interval: time.Hour}
	take(t, s, "q", r)
	old, err := s.Take(ctx, "q", r) // an hour away
	if err != nil {
		t.Fatal(err)
	}
	if _, valid, err := s.check(ctx, "q", old); err != nil || !valid {
		t.Fatalf("check before restart: valid %v, %v", valid, err)
	}

	srv.Stop()
	start := time.Now()
	tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := s.Take(tctx, "q", r); err == nil || !strings.Contains(err.Error(), `leaky: take "q"`) {
		t.Fatalf("Take with Redis down: %v, want a wrapped error", err)
	}
	if err := Wait(tctx, s, "q", r, nil); err == nil {
		t.Fatal("Wait with Redis down succeeded")
	}
	if _, err := s.PausedFor(tctx, "q"); err == nil {
		t.Fatal("PausedFor with Redis down succeeded")
	}
	if err := s.Pause(tctx, "q", time.Second); err == nil {
		t.Fatal("Pause with Redis down succeeded")
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("calls with Redis down took %v", d)
	}

	srv.Start()
	// The state is gone: the schedule restarts at now...
	if w := take(t, s, "q", r); w != 0 {
		t.Fatalf("first wait after restart %v, want 0", w)
	}
	// ...and the reservation made before is void, so it cannot overlap the new schedule.
	if _, valid, err := s.check(ctx, "q", old); err != nil || valid {
		t.Fatalf("check after restart: valid %v, %v; want void", valid, err)
	}
}

// TestWaitRetakesAfterStateLoss: a Wait whose reservation was made in a state that Redis lost
// takes a new slot instead of delivering.
func TestWaitRetakesAfterStateLoss(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	s := &lossy{Redis: NewRedis(srv.Client, RedisConfig{Prefix: testenv.Prefix(t)}), srv: srv}
	r := Rate{Interval: 20 * time.Millisecond}
	take(t, s.Redis, "q", r) // the next slot is 20ms away
	if err := Wait(ctx, s, "q", r, nil); err != nil {
		t.Fatal(err)
	}
	if s.takes != 2 {
		t.Fatalf("%d takes, want 2: the reservation from before the loss was used", s.takes)
	}
}

// lossy deletes the queue's state right after its first take, as a Redis restart would.
type lossy struct {
	*Redis
	srv   *testenv.RedisServer
	takes int
}

func (l *lossy) Take(ctx context.Context, queue string, r Rate) (Slot, error) {
	slot, err := l.Redis.Take(ctx, queue, r)
	l.takes++
	if l.takes == 1 {
		if err := l.srv.Client.Del(ctx, l.key(queue)).Err(); err != nil {
			return slot, errors.Join(err)
		}
	}
	return slot, err
}
