package ingress

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/limit"
)

// TestBreaker walks the circuit breaker through its states on a fixed clock.
func TestBreaker(t *testing.T) {
	c := &clock{t: epoch}
	var changes []BreakerState
	b := newBreaker(3, time.Second, c.Now, func(s BreakerState) { changes = append(changes, s) })
	call := func(ok bool) bool {
		allowed, probe := b.allow()
		if allowed {
			o := failedHard
			if ok {
				o = succeeded
			}
			b.done(probe, o)
		}
		return allowed
	}
	// Failures that are not consecutive do not open it.
	call(false)
	call(false)
	call(true)
	call(false)
	call(false)
	if b.current() != BreakerClosed {
		t.Fatalf("state %v after non-consecutive failures, want closed", b.current())
	}
	call(false) // the third in a row
	if b.current() != BreakerOpen || call(true) {
		t.Fatalf("state %v after 3 consecutive failures, want open and refusing calls", b.current())
	}
	c.Advance(999 * time.Millisecond)
	if ok, _ := b.allow(); ok {
		t.Fatal("open breaker let a call through before its cool-down")
	}
	c.Advance(time.Millisecond)
	ok, probe := b.allow()
	if !ok || !probe || b.current() != BreakerHalfOpen {
		t.Fatalf("after the cool-down: allow = %v, %v, state %v; want one probe, half-open", ok, probe, b.current())
	}
	if ok, _ := b.allow(); ok {
		t.Fatal("half-open breaker let a second call through while the probe is out")
	}
	b.done(true, failedHard) // the probe failed: open again, for another cool-down
	if b.current() != BreakerOpen || call(true) {
		t.Fatalf("after a failed probe: state %v, want open", b.current())
	}
	c.Advance(time.Second)
	ok, probe = b.allow()
	b.abandon(probe) // the caller went away: the next call may probe
	if !ok {
		t.Fatal("no probe after the second cool-down")
	}
	if !call(true) || b.current() != BreakerClosed {
		t.Fatalf("after a good probe: state %v, want closed", b.current())
	}
	want := []BreakerState{BreakerOpen, BreakerHalfOpen, BreakerOpen, BreakerHalfOpen, BreakerClosed}
	if !slices.Equal(changes, want) {
		t.Fatalf("state changes %v, want %v", changes, want)
	}
}

// TestBreakerTimeouts: timeouts — which a process starved of CPU sees from a healthy store —
// open the breaker only once they have lasted the timeout span with no success in between; a
// hard failure among them opens it at once.
func TestBreakerTimeouts(t *testing.T) {
	c := &clock{t: epoch}
	b := newBreaker(3, time.Second, c.Now, nil)
	call := func(o outcome) {
		if ok, probe := b.allow(); ok {
			b.done(probe, o)
		}
	}
	for range 20 { // a burst of timeouts, 10ms apart
		call(timedOut)
		c.Advance(10 * time.Millisecond)
	}
	if b.current() != BreakerClosed {
		t.Fatalf("state %v after 200ms of timeouts, want closed", b.current())
	}
	call(succeeded) // the process got its CPU back
	for range 3 {
		call(timedOut)
		c.Advance(DefaultBreakerTimeoutSpan / 2)
	}
	if b.current() != BreakerOpen {
		t.Fatalf("state %v after %v of timeouts and no success, want open", b.current(), DefaultBreakerTimeoutSpan)
	}
	c.Advance(time.Second)
	call(succeeded) // the probe
	call(timedOut)
	call(timedOut)
	call(failedHard) // a refused connection: the store is down
	if b.current() != BreakerOpen {
		t.Fatalf("state %v after a run with a hard failure, want open", b.current())
	}
}

// TestBreakerHealthySlowStore: a Redis that answers late for a moment (CLIENT PAUSE stands in
// for this process missing its CPU: either way calls time out while the store is healthy)
// does not open the breaker, so decisions go on coming from the store. A stopped Redis opens
// it within a few calls, and it closes once Redis is back. Before timeouts were told from hard
// failures, the slow moment opened it.
//
// The calls must time out at least DefaultBreakerFailures times within the pause, which takes
// this process being scheduled: one that stalls through the pause (beside other builds, 1 call
// of the 7 it has time for) makes too few. Such a shortfall is tried again, up to 3 times, only
// when the process's stalls (testenv.Lag) lasted at least the store_timeout of each call
// missing; any other fails at once, and the breaker must stay closed after every attempt.
func TestBreakerHealthySlowStore(t *testing.T) {
	rs := testenv.Redis(t)
	g, e, _ := gateApp(t, storeFailureYAML, Options{
		Limiter: limit.NewRedis(storeClient(t, rs), limit.RedisConfig{Prefix: testenv.Prefix(t)}),
	})
	get := func() { serve(e, httptestRequest("GET", "/open", "198.51.100.1:1")) }
	get()
	const storeTimeout = 50 * time.Millisecond // storeFailureYAML's
	lag := testenv.NewLag(t)
	for attempt := 1; ; attempt++ {
		// Redis stalls for 400ms: every call in that time times out.
		from := time.Now()
		if err := rs.Client.Do(context.Background(), "CLIENT", "PAUSE", "400", "ALL").Err(); err != nil {
			t.Fatal(err)
		}
		stalled := 0
		for start := time.Now(); time.Since(start) < 350*time.Millisecond; {
			began := time.Now()
			get()
			if time.Since(began) >= 40*time.Millisecond {
				stalled++
			}
		}
		to := time.Now()
		testenv.WaitFor(t, 5*time.Second, "Redis to answer again", func() bool {
			return rs.Client.Ping(context.Background()).Err() == nil
		})
		get()
		if s := g.breakerState(); s != BreakerClosed {
			t.Fatalf("breaker %v after a 400ms stall of a healthy Redis (attempt %d, %d calls timed out), want closed", s, attempt, stalled)
		}
		if stalled >= DefaultBreakerFailures {
			break
		}
		lost, worst := lag.Lost(from, to)
		need := time.Duration(DefaultBreakerFailures-stalled) * storeTimeout
		if lost < need || attempt == 3 {
			t.Fatalf("attempt %d: %d calls timed out during the stall, want at least %d (the process lost %v of the %v to stalls, the longest %v; %v would explain it)",
				attempt, stalled, DefaultBreakerFailures, lost, to.Sub(from).Round(time.Millisecond), worst, need)
		}
		t.Logf("attempt %d: %d calls timed out during the stall; the process lost %v of the %v to stalls (the longest %v): again",
			attempt, stalled, lost, to.Sub(from).Round(time.Millisecond), worst)
	}
	// A stopped Redis refuses connections: the breaker opens.
	rs.Stop()
	testenv.WaitFor(t, 5*time.Second, "the breaker to open", func() bool {
		get()
		return g.breakerState() == BreakerOpen
	})
	rs.Start()
	testenv.WaitFor(t, 10*time.Second, "the breaker to close", func() bool {
		get()
		return g.breakerState() == BreakerClosed
	})
}

// storeFailureYAML has a rule that fails open and one that fails closed.
const storeFailureYAML = `
store_timeout: 50ms
rules:
  - { name: open,   match: { path: /open },   algorithm: token_bucket, limit: 100000, period: 1s, on_store_error: allow }
  - { name: capped, match: { path: /capped }, algorithm: fixed_window, limit: 2, period: 1h }
  - { name: closed, match: { path: /closed }, algorithm: fixed_window, limit: 100000, period: 1s, on_store_error: deny }
`

// gateApp is an echo app with a gate and a handler that answers 200: the decision path
// alone.
func gateApp(t *testing.T, yaml string, opts Options) (*gate, *echo.Echo, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	g := testGate(t, parseConfig(t, "http://127.0.0.1:1", yaml), opts)
	e := echo.New()
	e.Pre(gateMiddleware(g))
	e.Any("/*", func(c echo.Context) error { return c.NoContent(http.StatusOK) })
	return g, e, reg
}

// TestStoreDown kills redis-server under load. Requests must go on without waiting for it:
// rules that fail open are decided in-process (p99 latency under 5 ms, no errors), rules
// that fail closed answer 503. Once redis-server is back, decisions come from it again.
func TestStoreDown(t *testing.T) {
	rs := testenv.Redis(t)
	rdb := storeClient(t, rs)
	prefix := testenv.Prefix(t)
	g, e, reg := gateApp(t, storeFailureYAML, Options{Limiter: limit.NewRedis(rdb, limit.RedisConfig{Prefix: prefix})})
	redisKeys := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		keys, err := rs.Client.Keys(ctx, prefix+"*").Result()
		if err != nil {
			return -1
		}
		return len(keys)
	}

	// Load: 8 clients, each a request per millisecond at most.
	type sample struct {
		at      time.Time
		latency time.Duration
		code    int
	}
	var (
		mu      sync.Mutex
		samples []sample
		stop    atomic.Bool
		wg      sync.WaitGroup
	)
	for i := range 8 {
		wg.Go(func() {
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			var mine []sample
			peer := "192.0.2." + string(rune('1'+i)) + ":1000"
			for !stop.Load() {
				r := httptest.NewRequest("GET", "/open", nil)
				r.RemoteAddr = peer
				w := httptest.NewRecorder()
				start := time.Now()
				e.ServeHTTP(w, r)
				mine = append(mine, sample{start, time.Since(start), w.Code})
				<-tick.C
			}
			mu.Lock()
			samples = append(samples, mine...)
			mu.Unlock()
		})
	}
	defer func() {
		stop.Store(true)
		wg.Wait()
	}()

	testenv.WaitFor(t, 5*time.Second, "decisions stored in redis", func() bool { return redisKeys() > 0 })
	// The capped rule is at its limit in Redis before the crash.
	for range 2 {
		if res := serve(e, httptestRequest("GET", "/capped", "198.51.100.1:1")); res.StatusCode != http.StatusOK {
			t.Fatalf("capped: status %d", res.StatusCode)
		}
	}
	rs.Stop()
	down := time.Now()
	testenv.WaitFor(t, 5*time.Second, "the breaker to open", func() bool { return g.breakerState() == BreakerOpen })
	opened := time.Now()

	// Fails closed: 503 with Retry-After, as problem+json.
	res := serve(e, httptestRequest("GET", "/closed", "198.51.100.1:1"))
	if pb := readProblem(t, res, http.StatusServiceUnavailable); pb.RetryAfter < 1 || res.Header.Get("Retry-After") == "" {
		t.Fatalf("fail-closed answer %+v, Retry-After %q", pb, res.Header.Get("Retry-After"))
	}
	// Fails open, yet limited in-process: the fallback has its own count of the capped rule.
	for i := range 3 {
		res := serve(e, httptestRequest("GET", "/capped", "198.51.100.1:1"))
		if want := []int{200, 200, 429}[i]; res.StatusCode != want {
			t.Fatalf("capped request %d with redis down: status %d, want %d", i, res.StatusCode, want)
		}
	}
	// Let the load run on against the dead store for a while, through a half-open probe.
	testenv.WaitFor(t, 10*time.Second, "load with redis down", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return time.Since(down) > 1500*time.Millisecond && metric(t, reg, "sluice_decisions_total", "rule", "open", "outcome", "fail_open") > 1000
	})

	rs.Start()
	testenv.WaitFor(t, 10*time.Second, "decisions from redis again", func() bool {
		return g.breakerState() == BreakerClosed && redisKeys() > 0
	})
	up := time.Now()
	stop.Store(true)
	wg.Wait()

	var during []time.Duration
	for _, s := range samples {
		if s.code != http.StatusOK && s.code != http.StatusTooManyRequests {
			t.Errorf("a request at %v answered %d", s.at.Sub(down), s.code)
		}
		// Until the breaker opens, requests wait for the store's timeout; on a loaded
		// machine that takes longer, so the latency bound starts at the opening.
		if s.at.After(opened) && s.at.Before(up) {
			during = append(during, s.latency)
		}
	}
	if len(during) < 1000 {
		t.Fatalf("only %d requests while redis was down", len(during))
	}
	slices.Sort(during)
	p99 := during[len(during)*99/100]
	t.Logf("breaker open %v after redis went down; %d requests after that: p50 %v, p99 %v, max %v",
		opened.Sub(down), len(during), during[len(during)/2], p99, during[len(during)-1])
	if p99 >= 5*time.Millisecond {
		t.Errorf("p99 latency with redis down %v, want < 5ms", p99)
	}
	for _, m := range []struct {
		name   string
		labels []string
	}{
		{"sluice_store_errors_total", nil},
		{"sluice_decisions_total", []string{"rule", "open", "outcome", "fail_open"}},
		{"sluice_decisions_total", []string{"rule", "closed", "outcome", "fail_closed"}},
	} {
		if metric(t, reg, m.name, m.labels...) == 0 {
			t.Errorf("%s%v is 0", m.name, m.labels)
		}
	}
	if got := metric(t, reg, "sluice_breaker_state"); got != 0 {
		t.Errorf("sluice_breaker_state %v after recovery, want 0", got)
	}
}

// TestStoreTimeout checks that a store that hangs (CLIENT PAUSE) costs a request no more than
// store_timeout before the rule fails open.
func TestStoreTimeout(t *testing.T) {
	rs := testenv.Redis(t)
	rdb := storeClient(t, rs)
	_, e, reg := gateApp(t, storeFailureYAML, Options{
		Limiter: limit.NewRedis(rdb, limit.RedisConfig{Prefix: testenv.Prefix(t)}),
	})
	if res := serve(e, httptestRequest("GET", "/open", "198.51.100.1:1")); res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", res.StatusCode)
	}
	if err := rs.Client.Do(context.Background(), "CLIENT", "PAUSE", "1000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res := serve(e, httptestRequest("GET", "/open", "198.51.100.1:1"))
	took := time.Since(start)
	if res.StatusCode != http.StatusOK || took > time.Second {
		t.Fatalf("with redis paused: status %d after %v; want 200 after about 50ms", res.StatusCode, took)
	}
	if took < 40*time.Millisecond {
		t.Fatalf("answered after %v: the store call did not wait for its timeout", took)
	}
	if metric(t, reg, "sluice_store_errors_total") != 1 || metric(t, reg, "sluice_decisions_total", "rule", "open", "outcome", "fail_open") != 1 {
		t.Fatal("the timed-out call was not counted as a store error and a fail-open decision")
	}
	rs.Client.Do(context.Background(), "CLIENT", "UNPAUSE")
}

// current returns the state of b, for tests: the gate itself learns of changes by onChange.
func (b *breaker) current() BreakerState { return BreakerState(b.state.Load()) }

// breakerState reports the state of the circuit breaker in front of the limiter store of g;
// always BreakerClosed for an in-process limiter.
func (g *gate) breakerState() BreakerState {
	if g.breaker == nil {
		return BreakerClosed
	}
	return g.breaker.current()
}
