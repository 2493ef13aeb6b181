package limit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// Tests of the coalescing of concurrent decisions into shared pipelines (batch.go). The
// stores' behaviour with and without it is covered by the conformance and store tests.

// holdPipelines is a go-redis hook that holds each pipeline of scripts until the test lets it
// go, as a slow round trip would, and reports its scripts as it arrives.
type holdPipelines struct {
	entered chan []string // the scripts of each pipeline, as it arrives
	release chan struct{} // each value lets one pipeline go; closed, lets all go
	after   atomic.Pointer[func()]
}

func newHoldPipelines() *holdPipelines {
	return &holdPipelines{entered: make(chan []string, 1000), release: make(chan struct{})}
}

func (h *holdPipelines) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *holdPipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *holdPipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var names []string
		for _, c := range cmds {
			if strings.HasPrefix(c.Name(), "eval") {
				names = append(names, fmt.Sprint(c.Args()[3])) // the key
			}
		}
		if len(names) == 0 {
			return next(ctx, cmds)
		}
		h.entered <- names
		<-h.release
		err := next(ctx, cmds)
		if f := h.after.Swap(nil); f != nil {
			(*f)()
		}
		return err
	}
}

// next returns the scripts' keys of the next pipeline to arrive, failing the test when none
// arrives within a few seconds.
func (h *holdPipelines) next(t *testing.T) []string {
	t.Helper()
	select {
	case keys := <-h.entered:
		return keys
	case <-time.After(10 * time.Second):
		t.Fatal("no pipeline arrived")
		return nil
	}
}

// none checks that no further pipeline arrived.
func (h *holdPipelines) none(t *testing.T) {
	t.Helper()
	select {
	case keys := <-h.entered:
		t.Errorf("unexpected pipeline of %v", keys)
	default:
	}
}

// queued returns the number of calls and of scripts waiting in r's queue.
func queued(r *Redis) (calls, scripts int) {
	r.batch.mu.Lock()
	defer r.batch.mu.Unlock()
	return len(r.batch.queue), r.batch.queued
}

// checkIdle checks that r has nothing in flight and nothing queued.
func checkIdle(t *testing.T, r *Redis) {
	t.Helper()
	b := r.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.flying != 0 || len(b.queue) != 0 || b.queued != 0 {
		t.Errorf("batcher not idle: %d in flight, %d calls and %d scripts queued", b.flying, len(b.queue), b.queued)
	}
}

// result is what a call started by decideAsync returned.
type result struct {
	d   Decision
	err error
}

func decideAsync(ctx context.Context, r *Redis, key string, l Limit) <-chan result {
	ch := make(chan result, 1)
	go func() {
		d, err := r.Decide(ctx, key, l, 1)
		ch <- result{d, err}
	}()
	return ch
}

// await returns what the call returned, failing the test when it does not return within a
// few seconds: callers are to return promptly whatever their pipeline does.
func await(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not return")
		return result{}
	}
}

func loadScripts(t testing.TB, rdb *redis.Client) {
	t.Helper()
	for _, s := range append(scripts[:], redis.NewScript(multiSource)) {
		if err := s.Load(context.Background(), rdb).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRedisCoalesces holds the store's two pipelines in flight while 62 more calls arrive, and
// checks that the 62 (Decides, and DecideAlls of two requests, each one script run) then travel
// together in one pipeline, and that every decision is right: the hot key admits exactly its
// limit.
func TestRedisCoalesces(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.NewClient()
	loadScripts(t, rdb)
	hold := newHoldPipelines()
	rdb.AddHook(hold)
	r := NewRedis(rdb, RedisConfig{Prefix: testenv.Prefix(t), Pipelines: 2})
	ctx := context.Background()
	l := Limit{Algorithm: FixedWindow, Limit: 50, Period: 10000 * time.Hour}

	const callers = 64
	var admitted, others atomic.Int64
	errs := make(chan error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ds []Decision
			var err error
			if i%2 == 0 {
				var d Decision
				d, err = r.Decide(ctx, "hot", l, 1)
				ds = []Decision{d}
			} else {
				ds, err = r.DecideAll(ctx, []Request{{"hot", l, 1}, {fmt.Sprint("own-", i), l, 1}})
			}
			if err != nil {
				errs <- err
				return
			}
			if ds[0].Allowed {
				admitted.Add(1)
			}
			if len(ds) == 2 && ds[1].Allowed && ds[1].Remaining == l.Limit-1 {
				others.Add(1)
			}
		}()
	}
	first := [][]string{hold.next(t), hold.next(t)}
	testenv.WaitFor(t, 10*time.Second, "62 calls queued", func() bool {
		calls, _ := queued(r)
		return calls == callers-2
	})
	hold.none(t)
	close(hold.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	rest := hold.next(t)
	hold.none(t)
	if n := len(first[0]) + len(first[1]) + len(rest); n != callers {
		t.Errorf("%d scripts sent, want %d", n, callers)
	}
	if admitted.Load() != l.Limit || others.Load() != callers/2 {
		t.Errorf("admitted %d on the hot key (want %d) and %d own keys (want %d)",
			admitted.Load(), l.Limit, others.Load(), callers/2)
	}
	checkIdle(t, r)
}

// TestRedisCoalescesUnderLoad counts round trips while 64 goroutines decide as fast as they
// can, with nothing held: far fewer pipelines than calls.
func TestRedisCoalescesUnderLoad(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.NewClient()
	loadScripts(t, rdb)
	trips := &roundTrips{}
	rdb.AddHook(trips)
	r := NewRedis(rdb, RedisConfig{Prefix: testenv.Prefix(t)})
	ctx := context.Background()
	l := Limit{Algorithm: TokenBucket, Limit: 1 << 30, Period: time.Hour}

	const callers, each = 64, 50
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	start := make(chan struct{})
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for j := range each {
				if _, err := r.Decide(ctx, fmt.Sprint(i, ":", j), l, 1); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	cmds, pipes := trips.take()
	scripts := 0
	for _, p := range pipes {
		scripts += len(p)
	}
	t.Logf("%d decisions in %d pipelines (%.1f per round trip)", scripts, len(pipes), float64(scripts)/float64(len(pipes)))
	if len(cmds) != 0 || scripts != callers*each {
		t.Fatalf("sent %d single commands and %d scripts in pipelines, want %d in pipelines", len(cmds), scripts, callers*each)
	}
	if len(pipes) > callers*each/4 {
		t.Errorf("%d pipelines for %d calls from %d goroutines, want at most a quarter", len(pipes), callers*each, callers)
	}
	checkIdle(t, r)
}

// TestRedisBatchBounds checks the bounds: at most MaxBatch scripts per pipeline, at most
// 4 × MaxBatch scripts queued (the other callers wait for room), and a DecideAll of more
// requests than MaxBatch travels alone and whole, as one script run.
func TestRedisBatchBounds(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.NewClient()
	loadScripts(t, rdb)
	hold := newHoldPipelines()
	rdb.AddHook(hold)
	const maxBatch, callers = 8, 64
	r := NewRedis(rdb, RedisConfig{Prefix: testenv.Prefix(t), MaxBatch: maxBatch, Pipelines: 1})
	ctx := context.Background()
	l := Limit{Algorithm: FixedWindow, Limit: 40, Period: 10000 * time.Hour}

	var admitted atomic.Int64
	errs := make(chan error, callers)
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := r.Decide(ctx, "hot", l, 1)
			if err != nil {
				errs <- err
			} else if d.Allowed {
				admitted.Add(1)
			}
		}()
	}
	sent := len(hold.next(t))
	testenv.WaitFor(t, 10*time.Second, "a full queue", func() bool {
		_, n := queued(r)
		return n == 4*maxBatch
	})
	close(hold.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	pipes := 1
	for len(hold.entered) > 0 {
		keys := hold.next(t)
		if len(keys) > maxBatch {
			t.Errorf("a pipeline of %d scripts, want at most %d", len(keys), maxBatch)
		}
		sent += len(keys)
		pipes++
	}
	if sent != callers || pipes < 1+(callers-1+maxBatch-1)/maxBatch {
		t.Errorf("%d scripts in %d pipelines, want %d in at least %d", sent, pipes, callers, 1+(callers-1+maxBatch-1)/maxBatch)
	}
	if admitted.Load() != l.Limit {
		t.Errorf("admitted %d, want %d", admitted.Load(), l.Limit)
	}

	big := make([]Request, maxBatch+3)
	for i := range big {
		big[i] = Request{Key: fmt.Sprint("big-", i), Limit: l, Cost: 1}
	}
	if _, err := r.DecideAll(ctx, big); err != nil {
		t.Fatal(err)
	}
	if keys := hold.next(t); len(keys) != 1 {
		t.Errorf("a DecideAll of %d requests went in a pipeline of %d scripts, want one run of them all", len(big), len(keys))
	}
	hold.none(t)
	checkIdle(t, r)
}

// TestRedisBatchContext checks that each caller's context is honoured while its pipeline is
// held: a call cancelled or timed out while queued returns at once and is never charged; one
// whose context ends after a sender took it but before the pipeline left is dropped, not
// charged; one cancelled while its scripts are in another call's pipeline returns at once, and
// is charged (as a timed-out EVALSHA may be).
func TestRedisBatchContext(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.NewClient()
	loadScripts(t, rdb)
	hold := newHoldPipelines()
	rdb.AddHook(hold)
	r := NewRedis(rdb, RedisConfig{Prefix: testenv.Prefix(t), Pipelines: 1})
	bg := context.Background()
	l := Limit{Algorithm: FixedWindow, Limit: 10, Period: 10000 * time.Hour}

	lead := decideAsync(bg, r, "lead", l)
	if keys := hold.next(t); len(keys) != 1 || keys[0] != r.prefix+"{fw:lead}" {
		t.Fatalf("first pipeline %v, want the lone first call's", keys)
	}
	ctxA, cancelA := context.WithCancel(bg)
	ctxB, cancelB := context.WithCancel(bg)
	ctxC, cancelC := context.WithTimeout(bg, time.Minute)
	defer cancelC()
	ctxD, cancelD := context.WithTimeout(bg, 30*time.Second) // C, the latest deadline, will send
	defer cancelD()
	a := decideAsync(ctxA, r, "a", l)
	b := decideAsync(ctxB, r, "b", l)
	c := decideAsync(ctxC, r, "c", l)
	d := decideAsync(ctxD, r, "d", l)
	testenv.WaitFor(t, 10*time.Second, "4 calls queued", func() bool {
		calls, _ := queued(r)
		return calls == 4
	})

	// Timed out while queued, and cancelled while queued.
	ctxE, cancelE := context.WithTimeout(bg, 20*time.Millisecond)
	defer cancelE()
	if res := await(t, decideAsync(ctxE, r, "e", l)); !errors.Is(res.err, context.DeadlineExceeded) {
		t.Errorf("call timed out while queued returned %s, %v; want context.DeadlineExceeded", show(res.d), res.err)
	}
	cancelA()
	if res := await(t, a); !errors.Is(res.err, context.Canceled) {
		t.Errorf("call cancelled while queued returned %s, %v; want context.Canceled", show(res.d), res.err)
	}
	if calls, _ := queued(r); calls != 3 {
		t.Errorf("%d calls queued after two gave up, want 3", calls)
	}

	// Cancelled as the first pipeline returns, before the queue is sent: not sent (taken out
	// of the queue by its caller or dropped by the sender, whichever comes first).
	cancelOnReturn := func() { cancelB() }
	hold.after.Store(&cancelOnReturn)
	hold.release <- struct{}{}
	if res := await(t, lead); res.err != nil || !res.d.Allowed {
		t.Errorf("first call: %s, %v", show(res.d), res.err)
	}
	if res := await(t, b); !errors.Is(res.err, context.Canceled) {
		t.Errorf("call cancelled before its pipeline left returned %s, %v; want context.Canceled", show(res.d), res.err)
	}
	keys := hold.next(t)
	slices.Sort(keys) // c and d queued in either order
	if want := []string{r.prefix + "{fw:c}", r.prefix + "{fw:d}"}; fmt.Sprint(keys) != fmt.Sprint(want) {
		t.Errorf("second pipeline %v, want %v: only the calls that did not give up", keys, want)
	}

	// Cancelled while in flight in C's pipeline: returns at once.
	cancelD()
	if res := await(t, d); !errors.Is(res.err, context.Canceled) {
		t.Errorf("call cancelled in flight returned %s, %v; want context.Canceled", show(res.d), res.err)
	}
	hold.release <- struct{}{}
	if res := await(t, c); res.err != nil || !res.d.Allowed {
		t.Errorf("the sender of the second pipeline: %s, %v", show(res.d), res.err)
	}
	close(hold.release)
	checkIdle(t, r)

	for key, charged := range map[string]int64{"lead": 1, "a": 0, "b": 0, "c": 1, "d": 1, "e": 0} {
		got, err := r.Decide(bg, key, l, 1)
		if want := l.Limit - charged - 1; err != nil || got.Remaining != want {
			t.Errorf("key %q: %s, %v; want remaining %d (charged %d before)", key, show(got), err, want, charged)
		}
	}
}

// TestRedisBatchCancelStorm runs many callers whose contexts end at random, around the round
// trip's duration, so that they give up in every phase: queued, taken, chosen to send, in
// flight. Every call must return; errors must be the callers' own; every decision reported as
// admitted must have been charged and nothing charged beyond the calls that may have been;
// and afterwards nothing is in flight, nothing queued and no goroutine left.
func TestRedisBatchCancelStorm(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.NewClient()
	loadScripts(t, rdb)
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	r := NewRedis(rdb, RedisConfig{Prefix: testenv.Prefix(t), MaxBatch: 8}) // a queue of 32: some wait for room
	l := Limit{Algorithm: FixedWindow, Limit: 1 << 20, Period: 10000 * time.Hour}

	const callers, each = 64, 200
	var ok, gaveUp atomic.Int64
	errs := make(chan error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), seedFromEnv(11)))
			for range each {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				switch rng.IntN(4) {
				case 0:
					ctx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(2000))*time.Microsecond)
				case 1:
					ctx, cancel = context.WithCancel(ctx)
					time.AfterFunc(time.Duration(rng.IntN(2000))*time.Microsecond, cancel)
				}
				var err error
				if rng.IntN(2) == 0 {
					_, err = r.Decide(ctx, "hot", l, 1)
				} else {
					_, err = r.DecideAll(ctx, []Request{{"hot", l, 1}})
				}
				cancel()
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
					gaveUp.Add(1)
				default:
					errs <- err
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("callers did not all return")
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	checkIdle(t, r)
	d, err := r.Decide(context.Background(), "hot", l, 1)
	if err != nil {
		t.Fatal(err)
	}
	charged := l.Limit - d.Remaining - 1
	t.Logf("%d decided, %d gave up, %d charged", ok.Load(), gaveUp.Load(), charged)
	if charged < ok.Load() || charged > ok.Load()+gaveUp.Load() {
		t.Errorf("%d charged for %d decisions and %d calls that gave up", charged, ok.Load(), gaveUp.Load())
	}
}

// TestRedisBatchRedisDown kills Redis while 64 goroutines decide through shared pipelines:
// every caller gets an error promptly (not its deadline, minutes away), and once Redis is
// back, decisions work again (the restarted server knows no scripts: EVAL fallback).
func TestRedisBatchRedisDown(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.NewClient()
	r := NewRedis(rdb, RedisConfig{Prefix: testenv.Prefix(t)})
	l := Limit{Algorithm: FixedWindow, Limit: 1 << 20, Period: 10000 * time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	const callers = 64
	var decided atomic.Int64
	failed := make(chan error, callers)
	for i := range callers {
		go func() {
			for j := 0; ; j++ {
				if _, err := r.Decide(ctx, fmt.Sprint(i, ":", j), l, 1); err != nil {
					failed <- err
					return
				}
				decided.Add(1)
			}
		}()
	}
	testenv.WaitFor(t, 10*time.Second, "decisions flowing", func() bool {
		select {
		case err := <-failed:
			t.Fatalf("before the kill: %v", err)
		default:
		}
		return decided.Load() >= 1000
	})
	srv.Stop()
	stopped := time.Now()
	for range callers {
		select {
		case err := <-failed:
			if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a caller failed with %v: its deadline, not the dead server", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a caller did not return within 10s of Redis dying")
		}
	}
	t.Logf("all %d callers failed within %v of the kill", callers, time.Since(stopped))
	checkIdle(t, r)

	srv.Start()
	testenv.WaitFor(t, 10*time.Second, "a decision after restart", func() bool {
		_, err := r.Decide(ctx, "after", l, 1)
		return err == nil
	})
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := r.DecideAll(ctx, []Request{{fmt.Sprint("again-", i), l, 1}, {"again", l, 1}}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("after restart: %v", err)
	}
	d, err := r.Decide(ctx, "again", l, 1)
	if err != nil || d.Remaining != l.Limit-callers-1 {
		t.Errorf("after restart: %s, %v; want %d remaining", show(d), err, l.Limit-callers-1)
	}
	checkIdle(t, r)
}
