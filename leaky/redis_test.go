package leaky

import (
	"context"
	"strings"
	"sync/atomic"
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
	if _, valid, _, err := s.check(ctx, "q", old); err != nil || !valid {
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
	if _, valid, _, err := s.check(ctx, "q", old); err != nil || valid {
		t.Fatalf("check after restart: valid %v, %v; want void", valid, err)
	}
}

// TestWaitRetakesAfterStateLoss: a Wait whose reservation was made in a state that Redis lost
// takes a new slot instead of delivering.
func TestWaitRetakesAfterStateLoss(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	s := &lossy{Redis: NewRedis(srv.Client, RedisConfig{Prefix: testenv.Prefix(t)}), srv: srv}
	r := Rate{Interval: 200 * time.Millisecond}
	take(t, s.Redis, "q", r) // the next slot is 200ms away
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
			return slot, err
		}
	}
	return slot, err
}

// heldReply holds up the replies of the next n commands by delay once armed (hold), as a
// loaded machine holds up a reply on its way back: the server ran the script on time.
type heldReply struct{ delay, n atomic.Int64 } // ns; commands

func (h *heldReply) hold(d time.Duration, n int64) { h.delay.Store(int64(d)); h.n.Store(n) }

func (h *heldReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *heldReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *heldReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if h.n.Add(-1) >= 0 {
			time.Sleep(time.Duration(h.delay.Load())) // the condition under test: a reply 80ms late
		}
		return err
	}
}

// TestRedisHeldReply: a take whose reply is held up longer than a slot may be late still
// places its slot where the server put it, from the round trips before it. A slot reserved
// ahead is delivered on time, not as late as the reply; a slot free at once is given up, as
// it is already late.
func TestRedisHeldReply(t *testing.T) {
	srv := testenv.Redis(t)
	client := srv.NewClient()
	held := new(heldReply)
	client.AddHook(held)
	prefix := testenv.Prefix(t)
	s := &lastSlot{Redis: NewRedis(client, RedisConfig{Prefix: prefix})}
	ctx := context.Background()
	const delay = 80 * time.Millisecond // the tolerance at 10/s is 50ms
	// onTime is how late after its slot Wait may return a slot it used: the rate's tolerance
	// (a slot woken later is given up, the package's guarantee). It was 20ms, which a loaded
	// machine's timer wake-up overran (20.7ms under -race beside two CPU-bound loops) while
	// Wait was right to use the slot. A slot placed as late as the held reply would come
	// 80ms late, or be given up: either fails the checks below.
	onTime := perSecond10.Tolerance()

	// Reserved ahead: three takes make a backlog (and measure the round trip); the fourth's
	// reply is held up, and its slot is 300ms out.
	for range 3 {
		take(t, s, "ahead", perSecond10)
	}
	held.hold(delay, 1)
	var lates []time.Duration
	hooks := Hooks{OnGiveUp: func(late time.Duration) { lates = append(lates, late) }}
	if err := WaitHooks(ctx, s, "ahead", perSecond10, hooks); err != nil {
		t.Fatal(err)
	}
	// Redis runs on this host: its TIME and time.Now read the same clock.
	if late := time.Since(time.UnixMicro(s.last.sched)); late < 0 || late > onTime || len(lates) != 0 {
		t.Fatalf("reserved ahead: Wait returned %v after the slot (given up: %v), want on time", late, lates)
	}

	// The first take of a queue, held up: nothing yet bounds the clocks but its own 80ms
	// round trip. Wait checks the queue before the earliest the slot can be, which places it
	// again, and delivers on time. (Another schedule's take makes the backlog.)
	other := NewRedis(srv.NewClient(), RedisConfig{Prefix: prefix})
	take(t, other, "cold", perSecond10)
	held.hold(delay, 1)
	if err := WaitHooks(ctx, s, "cold", perSecond10, hooks); err != nil {
		t.Fatal(err)
	}
	if late := time.Since(time.UnixMicro(s.last.sched)); late < 0 || late > onTime || len(lates) != 0 {
		t.Fatalf("first take: Wait returned %v after the slot (given up: %v), want on time", late, lates)
	}

	// givenUpThenOnTime waits for a slot of queue that was held up: one slot given up about
	// delay late, then the next one on time. A slot after it may be given up too, when the
	// machine wakes Wait later than the tolerance for it (68ms beside two CPU-bound loops):
	// Wait reports each such slot, and is right to take another. The held one comes first.
	givenUpThenOnTime := func(name string, s *lastSlot, queue string) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second) // a slot given up for ever fails
		defer cancel()
		if err := WaitHooks(wctx, s, queue, perSecond10, hooks); err != nil {
			t.Fatal(err)
		}
		if len(lates) > 1 {
			t.Logf("%s: given up %v: the first for the held reply, the others woken late", name, lates)
		}
		if len(lates) == 0 || lates[0] < delay-5*time.Millisecond {
			t.Fatalf("%s: given up %v, want one slot given up about %v late", name, lates, delay)
		}
		if late := time.Since(time.UnixMicro(s.last.sched)); late < 0 || late > onTime {
			t.Fatalf("%s: Wait returned %v after the slot, want on time", name, late)
		}
		lates = nil
	}

	// A fresh process whose take and pause check are both held up: nothing bounds the clocks
	// better than those 80ms round trips, and the slot may be anywhere in them. While the
	// clock is young the slot is used only if on time however early it was: it is given up,
	// and the next one is on time.
	young := &lastSlot{Redis: NewRedis(client, RedisConfig{Prefix: prefix})}
	take(t, other, "young", perSecond10)
	held.hold(delay, 2)
	givenUpThenOnTime("young, take and check held", young, "young")

	// Free at once, and the first take of a fresh process: nothing bounds the clocks but the
	// take's own round trip, so the slot was anywhere in those 80ms. It may have been 80ms ago:
	// it is given up, and the next slot, 100ms after it, is delivered on time.
	fresh := &lastSlot{Redis: NewRedis(client, RedisConfig{Prefix: prefix})}
	held.hold(delay, 1)
	givenUpThenOnTime("fresh, free at once", fresh, "fresh")

	// Free at once (a burst): the held reply makes the slot 80ms late; it is given up and the
	// next one taken.
	burst := Rate{Interval: 100 * ms, Burst: 10}
	for range 3 {
		take(t, s, "now", burst)
	}
	held.hold(delay, 1)
	if err := WaitHooks(ctx, s, "now", burst, hooks); err != nil {
		t.Fatal(err)
	}
	if len(lates) != 1 || lates[0] < delay-5*time.Millisecond {
		t.Fatalf("free at once: given up %v, want one slot given up about %v late", lates, delay)
	}
}

// calls counts the commands a client sends.
type calls struct{ n atomic.Int64 }

func (c *calls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *calls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (c *calls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

// TestCheckFromLatestRead: a slot's check is answered from the queue's state as the latest take
// read it when that take was sent less than checkLead ago, without a round trip, once the
// clock is no longer young; an older reading is read again, and so sees another process's
// pause and a lost state; a pause made through the same schedule is never answered from a
// reading before it.
func TestCheckFromLatestRead(t *testing.T) {
	srv := testenv.Redis(t)
	client := srv.NewClient()
	n := new(calls)
	client.AddHook(n)
	prefix := testenv.Prefix(t)
	s := NewRedis(client, RedisConfig{Prefix: prefix})
	other := NewRedis(srv.NewClient(), RedisConfig{Prefix: prefix})
	ctx := context.Background()
	r := Rate{Interval: time.Hour}
	// age makes the latest reading of q older than checkLead.
	age := func(q string) {
		st := s.seen(q)
		st.mu.Lock()
		st.sent = st.sent.Add(-checkLead)
		st.mu.Unlock()
	}
	check := func(name, q string, slot Slot, wantCalls int64, wantPaused, wantValid bool) {
		t.Helper()
		before := n.n.Load()
		paused, valid, placed, err := s.check(ctx, q, slot)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if calls := n.n.Load() - before; calls != wantCalls || (paused > 0) != wantPaused || valid != wantValid {
			t.Fatalf("%s: %d round trips, paused %v, valid %v; want %d, paused %v, valid %v",
				name, calls, paused, valid, wantCalls, wantPaused, wantValid)
		}
		if !placed.At.Equal(slot.At) && placed.At.Sub(slot.At).Abs() > 10*time.Millisecond {
			t.Fatalf("%s: slot placed again %v away", name, placed.At.Sub(slot.At))
		}
	}

	if _, err := s.PausedFor(ctx, "warm"); err != nil { // loads the script: one round trip from now on
		t.Fatal(err)
	}
	// mature makes q's clock no longer young, as two seconds of samples would.
	mature := func(q string) {
		c := s.clock(q)
		c.mu.Lock()
		c.born -= youngFor.Microseconds()
		c.mu.Unlock()
	}
	// reserve takes q's first slot and returns its second, an hour out.
	reserve := func(q string) Slot {
		t.Helper()
		take(t, s, q, r)
		slot, err := s.Take(ctx, q, r)
		if err != nil {
			t.Fatal(err)
		}
		return slot
	}
	slot := reserve("q")
	// While the clock is young the check is a sample of its own: it asks.
	check("fresh take, young clock", "q", slot, 1, false, true)
	// A slot on a grid is answered from the reading all the same, placed strictly.
	wide := slot
	wide.wide = true
	before := n.n.Load()
	if _, _, placed, err := s.check(ctx, "q", wide); err != nil || n.n.Load() != before || !placed.strict {
		t.Fatalf("a slot on a grid, young clock: %v, %d round trips, strict %v; want 0, strict",
			err, n.n.Load()-before, placed.strict)
	}
	mature("q")
	check("fresh take", "q", slot, 0, false, true)

	// Another process pauses the queue: a reading from after it sees the pause.
	if err := other.Pause(ctx, "q", time.Minute); err != nil {
		t.Fatal(err)
	}
	age("q")
	check("old reading, paused by another", "q", slot, 1, true, true)
	check("the check's own reading", "q", slot, 0, true, true)

	// This process pauses a queue it has just read: the reading from before is not used.
	slot = reserve("p")
	mature("p")
	if err := s.Pause(ctx, "p", time.Minute); err != nil {
		t.Fatal(err)
	}
	check("paused here", "p", slot, 1, true, true)

	// The state is lost: an old reading is asked again and the slot is no longer valid.
	slot = reserve("l")
	mature("l")
	if err := srv.Client.Del(ctx, s.key("l")).Err(); err != nil {
		t.Fatal(err)
	}
	age("l")
	check("state lost", "l", slot, 1, false, false)

	// PausedFor always asks.
	before = n.n.Load()
	if _, err := s.PausedFor(ctx, "l"); err != nil || n.n.Load()-before != 1 {
		t.Fatalf("PausedFor: %v, %d round trips; want 1", err, n.n.Load()-before)
	}
}
