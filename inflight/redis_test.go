package inflight

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// TestRedisKeys: a cap is one sorted set of lease ids scored by expiry, living as long as its
// latest place; a key whose places are all released is gone.
func TestRedisKeys(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	prefix := testenv.Prefix(t)
	s := NewRedis(srv.Client, WithPrefix(prefix))
	short := ok(t)(s.Acquire(ctx, []Cap{{Key: "k", Limit: 3}}, 10*time.Second))
	long := ok(t)(s.Acquire(ctx, []Cap{{Key: "k", Limit: 3}}, 20*time.Second))
	members, err := srv.Client.ZRange(ctx, prefix+"k", 0, -1).Result()
	if err != nil || !slices.Equal(members, []string{short.Lease.ID, long.Lease.ID}) {
		t.Fatalf("ZRANGE %v, %v; want the two lease ids by expiry", members, err)
	}
	if ttl := srv.Client.PTTL(ctx, prefix+"k").Val(); ttl < 19*time.Second || ttl > 20*time.Second {
		t.Fatalf("PTTL %v; want the latest place's 20s", ttl)
	}
	// A shorter place taken later does not shorten the key's life.
	third := ok(t)(s.Acquire(ctx, []Cap{{Key: "k", Limit: 3}}, time.Second))
	if ttl := srv.Client.PTTL(ctx, prefix+"k").Val(); ttl < 19*time.Second {
		t.Fatalf("PTTL %v after a 1s place; want the latest place's 20s", ttl)
	}
	for _, l := range []Lease{short.Lease, long.Lease, third.Lease} {
		if err := s.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	if n := srv.Client.Exists(ctx, prefix+"k").Val(); n != 0 {
		t.Fatal("the key of a cap with no place held is still there")
	}
}

// TestRedisCrossSlot: the keys of one Acquire must share a hash slot, on a single server too;
// the error comes before Redis is contacted.
func TestRedisCrossSlot(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	s := NewRedis(srv.Client, WithPrefix(testenv.Prefix(t)))
	_, err := s.Acquire(ctx, []Cap{{Key: "tenant:a", Limit: 1}, {Key: "queue:q", Limit: 1}}, time.Second)
	if !errors.Is(err, ErrCrossSlot) {
		t.Fatalf("Acquire over two slots: %v, want ErrCrossSlot", err)
	}
	if n := srv.Client.DBSize(ctx).Val(); n != 0 {
		t.Fatalf("%d keys written by a refused Acquire", n)
	}
	if r := ok(t)(s.Acquire(ctx, []Cap{{Key: "{q}tenant:a", Limit: 1}, {Key: "{q}queue", Limit: 1}}, time.Second)); !r.Acquired {
		t.Fatalf("one hash tag: %+v", r)
	}
}

// TestSlot: Slot computes what the cluster does (CLUSTER KEYSLOT).
func TestSlot(t *testing.T) {
	c := cluster(t)
	ctx := context.Background()
	for _, k := range []string{"", "a", "foo", "{user1000}.following", "{}x", "x{}{y}", "{a}{b}", "sluice:inflight:{r:abc}:1", "{", "}{a}", "日本"} {
		want, err := c.Client.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := Slot(k); int64(got) != want {
			t.Errorf("Slot(%q) = %d, CLUSTER KEYSLOT = %d", k, got, want)
		}
	}
}

// TestRedisScriptFlushed: a server that forgot the scripts gets them again.
func TestRedisScriptFlushed(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	s := NewRedis(srv.Client, WithPrefix(testenv.Prefix(t)))
	caps := []Cap{{Key: "k", Limit: 1}}
	r := ok(t)(s.Acquire(ctx, caps, time.Minute))
	if err := srv.Client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if n := inFlight(t, s, "k"); n[0] != 1 {
		t.Fatalf("in flight %v", n)
	}
	if err := s.Release(ctx, r.Lease); err != nil {
		t.Fatal(err)
	}
	if r := ok(t)(s.Acquire(ctx, caps, time.Minute)); !r.Acquired {
		t.Fatal("not acquired after the release")
	}
}

// TestRedisClose: Close ends the subscription and every blocked Wait, which return ErrClosed;
// later Waits too.
func TestRedisClose(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	s := NewRedis(srv.NewClient(), WithPrefix(testenv.Prefix(t)), WithRecheck(time.Minute))
	caps := []Cap{{Key: "k", Limit: 1}}
	ok(t)(s.Acquire(ctx, caps, time.Minute))
	done := make(chan error, 1)
	go func() {
		_, err := s.Wait(ctx, caps, time.Minute)
		done <- err
	}()
	testenv.WaitFor(t, 5*time.Second, "the Wait to block", func() bool { return waiting(s) == 1 })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("blocked Wait after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a blocked Wait did not return after Close")
	}
	if _, err := s.Wait(ctx, caps, time.Minute); !errors.Is(err, ErrClosed) {
		t.Fatalf("Wait after Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestRedisDown: with Redis gone every call is an error, and a Wait returns it instead of
// waiting.
func TestRedisDown(t *testing.T) {
	srv := testenv.Redis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := NewRedis(srv.NewClient(), WithPrefix(testenv.Prefix(t)))
	defer s.Close()
	srv.Stop()
	caps := []Cap{{Key: "k", Limit: 1}}
	if _, err := s.Acquire(ctx, caps, time.Minute); err == nil {
		t.Fatal("Acquire without Redis: nil error")
	}
	if err := s.Release(ctx, Lease{ID: "x", Keys: []string{"k"}}); err == nil {
		t.Fatal("Release without Redis: nil error")
	}
	if _, err := s.Wait(ctx, caps, time.Minute); err == nil || ctx.Err() != nil {
		t.Fatalf("Wait without Redis: %v (ctx %v); want the store's error before the deadline", err, ctx.Err())
	}
	if _, err := s.InFlight(ctx, "k"); err == nil {
		t.Fatal("InFlight without Redis: nil error")
	}
}

// TestKeysMessage: a release's message carries any key, and a malformed one wakes nothing
// wrongly.
func TestKeysMessage(t *testing.T) {
	keys := []string{"a", "{t}:b:c", "with:colon:9:x", "new\nline", "12:34", ""}
	var got []string
	decodeKeys(encodeKeys(keys), func(k string) { got = append(got, k) })
	if !slices.Equal(got, keys) {
		t.Fatalf("decode(encode(%q)) = %q", keys, got)
	}
	for _, bad := range []string{"x", "3:ab", "99999999999999999999:a", ":a", "1a"} {
		got = nil
		decodeKeys(bad, func(k string) { got = append(got, k) })
		if len(got) != 0 {
			t.Errorf("decode(%q) = %q", bad, got)
		}
	}
}

// TestReleasePublishedOnlyWhenWaitedFor: a release is published to the other processes only
// while a Wait is refused a place of its cap; one that nobody waits for costs no message. A
// waiter in another process is woken by the message, not by its re-check (set to a minute).
func TestReleasePublishedOnlyWhenWaitedFor(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	prefix := testenv.Prefix(t)
	a := NewRedis(srv.Client, WithPrefix(prefix))
	b := NewRedis(srv.NewClient(), WithPrefix(prefix), WithRecheck(time.Minute))
	t.Cleanup(func() { b.Close() })
	sub := srv.NewClient().Subscribe(ctx, a.channel())
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	// next returns the next message on the channel, after a sentinel published now: a
	// release published before it comes first.
	next := func() string {
		t.Helper()
		if err := srv.Client.Publish(ctx, a.channel(), "sentinel").Err(); err != nil {
			t.Fatal(err)
		}
		m, err := sub.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m.Payload != "sentinel" {
			for { // drain up to the sentinel
				s, err := sub.ReceiveMessage(ctx)
				if err != nil || s.Payload == "sentinel" {
					break
				}
			}
		}
		return m.Payload
	}
	for _, key := range []string{"plain", "{q:orders}", "{q:orders}:t:a"} {
		caps := []Cap{{Key: key, Limit: 1}}
		held := ok(t)(a.Acquire(ctx, caps, time.Minute))
		if err := a.Release(ctx, held.Lease); err != nil {
			t.Fatal(err)
		}
		if m := next(); m != "sentinel" {
			t.Fatalf("%s: a release nobody waited for was published (%q)", key, m)
		}

		// A plain Acquire refused marks nothing.
		held = ok(t)(a.Acquire(ctx, caps, time.Minute))
		if res := ok(t)(b.Acquire(ctx, caps, time.Minute)); res.Acquired {
			t.Fatalf("%s: a second place of a cap of 1", key)
		}
		// A Wait refused: the release is published, and wakes it at once.
		got := make(chan error, 1)
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		go func() {
			res, err := b.Wait(wctx, caps, time.Minute)
			if err == nil {
				err = b.Release(ctx, res.Lease)
			}
			got <- err
		}()
		testenv.WaitFor(t, 5*time.Second, "the Wait to be refused", func() bool {
			ms, _ := waitMarks([]string{prefix + key})
			return srv.Client.Exists(ctx, ms[0]).Val() == 1
		})
		if err := a.Release(ctx, held.Lease); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("%s: Wait: %v (not woken by the release: its re-check is a minute)", key, err)
		}
		cancel()
		if m := next(); m == "sentinel" {
			t.Fatalf("%s: a release a Wait waited for was not published", key)
		}
	}
}

// TestWaitMarks: a key's waiting mark is in the key's hash slot, or there is none.
func TestWaitMarks(t *testing.T) {
	for _, c := range []struct {
		key  string
		want bool
	}{{"plain", true}, {"{q:orders}", true}, {"{q:orders}:t:a", true}, {"a{b", true},
		{"a}b", false}, // "{a}b}:waiting" hashes "a"
	} {
		marks, good := waitMarks([]string{c.key})
		if good != c.want {
			t.Errorf("waitMarks(%q): ok %v, want %v", c.key, good, c.want)
			continue
		}
		if good && (Slot(marks[0]) != Slot(c.key) || marks[0] == c.key) {
			t.Errorf("mark of %q is %q: slot %d, want %d", c.key, marks[0], Slot(marks[0]), Slot(c.key))
		}
	}
}
