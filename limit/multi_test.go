package limit

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// TestRedisMultiEpoch checks the epoch check of a run of several decisions (multi.lua) on a
// real redis-server: every algorithm's keys used up by DecideAlls, then a FLUSHALL: in the
// next DecideAll, the keys of hold limits are refused for at most their hold and those of allow
// limits admitted at once, in one script run; the loss is reported once.
func TestRedisMultiEpoch(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	var losses atomic.Int32
	r := NewRedis(srv.Client, RedisConfig{Prefix: testenv.Prefix(t), OnLoss: func(string) { losses.Add(1) }})
	var reqs []Request
	for _, a := range Algorithms {
		for _, mode := range []ResetMode{ResetConservative, ResetFresh} {
			l := Limit{Algorithm: a, Limit: 2, Period: time.Minute, Burst: 2, OnReset: mode}
			reqs = append(reqs, Request{Key: string(mode) + ":" + string(a), Limit: l, Cost: 1})
		}
	}
	for round, wantAllowed := range []bool{true, true, false} {
		ds, err := r.DecideAll(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		for i, d := range ds {
			if d.Allowed != wantAllowed || d.Remaining != max(0, 1-int64(round)) {
				t.Errorf("round %d, %s: %s; want allowed %v, remaining %d", round, reqs[i].Key, show(d), wantAllowed, max(0, 1-round))
			}
		}
	}
	if err := srv.Client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	ds, err := r.DecideAll(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range ds {
		held := reqs[i].Limit.OnReset == ResetConservative
		switch {
		case held && (d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > time.Minute):
			t.Errorf("%s after the flush: %s; want refused for at most a minute", reqs[i].Key, show(d))
		case !held && (!d.Allowed || d.Remaining != 1):
			t.Errorf("%s after the flush: %s; want admitted with 1 remaining", reqs[i].Key, show(d))
		}
	}
	if n := losses.Load(); n != 1 {
		t.Errorf("the loss was reported %d times, want once", n)
	}
}

// TestRedisMultiOnCluster checks, on a real three-node Redis Cluster, that the requests of a
// DecideAll whose keys share a hash slot are decided in one script run and the others by a
// script each, and that every decision is right, in the order of the requests.
func TestRedisMultiOnCluster(t *testing.T) {
	c := testenv.RedisCluster(t)
	ctx := context.Background()
	trips := &roundTrips{}
	c.Client.AddHook(trips)
	r := NewRedis(c.Client, RedisConfig{Prefix: testenv.Prefix(t), MaxBatch: -1})
	tb := Limit{Algorithm: TokenBucket, Limit: 2, Period: time.Hour}
	fw := Limit{Algorithm: FixedWindow, Limit: 2, Period: time.Hour}
	slot := hashSlot(r.key("a", algTokenBucket))
	same, other := "", ""
	for i := 0; same == "" || other == ""; i++ {
		k := fmt.Sprint("k", i)
		if hashSlot(r.key(k, algFixedWindow)) == slot {
			same = k
		} else if other == "" {
			other = k
		}
	}
	ds, err := r.DecideAll(ctx, []Request{{"a", tb, 1}, {same, fw, 1}, {other, fw, 1}, {"a", tb, 1}, {"a", tb, 1}})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		allowed   bool
		remaining int64
	}{{true, 1}, {true, 1}, {true, 1}, {true, 0}, {false, 0}}
	for i, d := range ds {
		if d.Allowed != want[i].allowed || d.Remaining != want[i].remaining {
			t.Errorf("request %d: %s; want allowed %v, remaining %d", i, show(d), want[i].allowed, want[i].remaining)
		}
	}
	cmds, pipes := trips.take() // an EVALSHA a node did not know is sent again as EVAL
	n := len(cmds)
	for _, p := range pipes {
		for _, name := range p {
			if name == "evalsha" {
				n++
			}
		}
	}
	if n != 2 {
		t.Errorf("sent commands %v and pipelines %v, want 2 scripts: one run of the slot's 4, one of the other key", cmds, pipes)
	}
}

// TestRedisMultiForeignValue checks that a run of several decisions in which one key holds
// something the scripts did not write is an error for the whole DecideAll, as a failing script
// of a pipeline was, not a decision nor a panic; and that a string there is no state.
func TestRedisMultiForeignValue(t *testing.T) {
	srv := testenv.Redis(t)
	ctx := context.Background()
	prefix := testenv.Prefix(t)
	r := NewRedis(srv.Client, RedisConfig{Prefix: prefix})
	l := Limit{Algorithm: TokenBucket, Limit: 2, Period: time.Hour}
	if err := srv.Client.Set(ctx, prefix+"{tb:b}", "garbage", 0).Err(); err != nil {
		t.Fatal(err)
	}
	ds, err := r.DecideAll(ctx, []Request{{"a", l, 1}, {"b", l, 2}})
	if err != nil || !ds[0].Allowed || ds[0].Remaining != 1 || !ds[1].Allowed || ds[1].Remaining != 0 {
		t.Fatalf("a string at a key of the run: %v, %v; want both admitted, the second on a full bucket", ds, err)
	}
	if err := srv.Client.Del(ctx, prefix+"{tb:b}").Err(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Client.RPush(ctx, prefix+"{tb:b}", "x").Err(); err != nil {
		t.Fatal(err)
	}
	if ds, err := r.DecideAll(ctx, []Request{{"a", l, 1}, {"b", l, 1}}); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("a list at a key of the run: %v, %v; want a WRONGTYPE error", ds, err)
	}
}
