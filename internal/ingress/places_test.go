package ingress

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/inflight"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/limit"
)

// slowUpstream is an upstream that counts the requests open at it at once (a high-water mark)
// and holds those with ?block=1 until the test lets one go (release) or their client goes.
type slowUpstream struct {
	*httptest.Server
	open, high atomic.Int64
	arrived    chan struct{} // a blocking request arrived
	release    chan struct{} // one receive lets one blocked request answer
}

func newSlowUpstream(t *testing.T) *slowUpstream {
	u := &slowUpstream{arrived: make(chan struct{}, 64), release: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.open.Add(1)
		defer u.open.Add(-1)
		for h := u.high.Load(); n > h && !u.high.CompareAndSwap(h, n); h = u.high.Load() {
		}
		if r.URL.Query().Get("block") == "1" {
			u.arrived <- struct{}{}
			select {
			case <-u.release:
			case <-r.Context().Done():
				return
			}
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(u.Close)
	return u
}

// placesFixture is a Server whose concurrency places live in memory or in a real Redis.
type placesFixture struct {
	t   *testing.T
	srv *Server
	up  *slowUpstream
	reg *prometheus.Registry
}

type placesStore struct {
	name string
	opts func(t *testing.T) Options
}

func placesStores() []placesStore {
	return []placesStore{
		{"memory", func(*testing.T) Options { return Options{} }},
		{"redis", func(t *testing.T) Options {
			rdb := storeClient(t, testenv.Redis(t))
			prefix := testenv.Prefix(t)
			return Options{Limiter: limit.NewRedis(rdb, limit.RedisConfig{Prefix: prefix}),
				Places: inflight.NewRedis(rdb, inflight.WithPrefix(prefix+"inflight:"))}
		}},
	}
}

func newPlacesFixture(t *testing.T, yaml string, opts Options) *placesFixture {
	t.Helper()
	f := &placesFixture{t: t, up: newSlowUpstream(t), reg: prometheus.NewRegistry()}
	opts.Registerer = f.reg
	srv, err := New(parseConfig(t, f.up.URL, yaml), opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(srv.Close)
	f.srv = srv
	return f
}

// start serves a request in the background; its response arrives on the channel.
func (f *placesFixture) start(ctx context.Context, target, key string) <-chan *http.Response {
	done := make(chan *http.Response, 1)
	go func() { done <- f.do(ctx, target, key) }()
	return done
}

func (f *placesFixture) do(ctx context.Context, target, key string) *http.Response {
	r := httptest.NewRequestWithContext(ctx, "GET", target, nil)
	r.RemoteAddr = "192.0.2.10:40000"
	if key != "" {
		r.Header.Set("X-API-Key", key)
	}
	w := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(w, r)
	return w.Result()
}

// inFlight reads the places held under a rule's key, from the store the gate takes them from.
func (f *placesFixture) inFlight(rule, key string) int64 {
	f.t.Helper()
	n, err := f.srv.gate.places.InFlight(context.Background(), rule+"\x00"+key)
	if err != nil {
		f.t.Fatal(err)
	}
	return n[0]
}

func (f *placesFixture) arrive() {
	f.t.Helper()
	select {
	case <-f.up.arrived:
	case <-time.After(10 * time.Second):
		f.t.Fatal("a blocking request did not reach the upstream")
	}
}

func status(t *testing.T, done <-chan *http.Response, want int) *http.Response {
	t.Helper()
	select {
	case res := <-done:
		if res.StatusCode != want {
			body, _ := io.ReadAll(res.Body)
			t.Fatalf("status %d, want %d; body %s", res.StatusCode, want, body)
		}
		return res
	case <-time.After(10 * time.Second):
		t.Fatalf("no answer within 10s, want %d", want)
	}
	return nil
}

const connsYAML = `
rules:
  - name: conns
    key: [header:X-API-Key]
    algorithm: concurrency
    limit: 2
`

// clusterStore keeps places (and limits) on a Redis Cluster.
var clusterStore = placesStore{"redis-cluster", func(t *testing.T) Options {
	c := testenv.RedisCluster(t)
	rdb := c.NewClient()
	prefix := testenv.Prefix(t)
	return Options{Limiter: limit.NewRedis(rdb, limit.RedisConfig{Prefix: prefix}),
		Places: inflight.NewRedis(rdb, inflight.WithPrefix(prefix+"inflight:"))}
}}

// TestConcurrencyRule: at most limit requests of a key are at the upstream at once; the next
// one is answered 429 with concurrency RateLimit headers and no Retry-After; other keys go on;
// a place comes back when its request's answer is finished.
func TestConcurrencyRule(t *testing.T) {
	for _, st := range append(placesStores(), clusterStore) {
		t.Run(st.name, func(t *testing.T) {
			f := newPlacesFixture(t, connsYAML, st.opts(t))
			ctx := context.Background()
			first := f.start(ctx, "/x?block=1", "A")
			f.arrive()
			second := f.start(ctx, "/x?block=1", "A")
			f.arrive()
			if n := f.inFlight("conns", "A"); n != 2 {
				t.Fatalf("in flight %d, want 2", n)
			}

			res := f.do(ctx, "/x", "A")
			p := readProblem(t, res, http.StatusTooManyRequests)
			if p.Type != QuotaExceededType || len(p.ViolatedPolicies) != 1 || p.ViolatedPolicies[0] != "conns" || p.RetryAfter != 0 {
				t.Fatalf("429 body %+v", p)
			}
			if !strings.Contains(p.Detail, "in flight") {
				t.Errorf("detail %q does not say it is about requests in flight", p.Detail)
			}
			h := res.Header
			for name, want := range map[string]string{
				"RateLimit-Policy": `"conns";q=2;qu="concurrent-requests"`, "RateLimit": `"conns";r=0`,
				"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "0",
				"Retry-After": "", "X-RateLimit-Retry-After": "", "X-RateLimit-Reset": "",
			} {
				if got := h.Get(name); got != want {
					t.Errorf("%s: %q, want %q", name, got, want)
				}
			}
			if pol, err := parseSFList(h.Get("RateLimit-Policy")); err != nil || pol[0].params["qu"] != "concurrent-requests" {
				t.Errorf("RateLimit-Policy %q does not parse as a structured field with qu: %v", h.Get("RateLimit-Policy"), err)
			}
			if f.up.high.Load() > 2 {
				t.Fatalf("%d requests at the upstream at once", f.up.high.Load())
			}

			// Another key is not held back.
			other := f.do(ctx, "/x", "B")
			if other.StatusCode != http.StatusOK || other.Header.Get("RateLimit") != `"conns";r=1` {
				t.Fatalf("key B: %d, RateLimit %q", other.StatusCode, other.Header.Get("RateLimit"))
			}

			// One finishes (the upstream lets either go): its place comes back, and the next
			// request of A is forwarded.
			answers := make(chan *http.Response, 2)
			go func() { answers <- <-first }()
			go func() { answers <- <-second }()
			f.up.release <- struct{}{}
			status(t, answers, http.StatusOK)
			if n := f.inFlight("conns", "A"); n != 1 {
				t.Fatalf("in flight %d after one answer finished, want 1", n)
			}
			res = f.do(ctx, "/x", "A")
			if res.StatusCode != http.StatusOK || res.Header.Get("RateLimit") != `"conns";r=0` {
				t.Fatalf("after a release: %d, RateLimit %q", res.StatusCode, res.Header.Get("RateLimit"))
			}
			f.up.release <- struct{}{}
			status(t, answers, http.StatusOK)
			if n := f.inFlight("conns", "A"); n != 0 {
				t.Fatalf("in flight %d after every answer, want 0", n)
			}
			if got := metric(t, f.reg, "sluice_decisions_total", "rule", "conns", "outcome", "rejected"); got != 1 {
				t.Errorf("rejected decisions %v, want 1", got)
			}
		})
	}
}

// TestConcurrencyPlacesGivenBack: a place taken is given back whatever way the request ends —
// the upstream down, the client gone, the rule's timeout — and a request that another rule
// refuses, or that a later concurrency rule refuses, holds none.
func TestConcurrencyPlacesGivenBack(t *testing.T) {
	for _, st := range placesStores() {
		t.Run(st.name, func(t *testing.T) {
			yaml := `
rules:
  - { name: per-ip, algorithm: concurrency, limit: 5, timeout: 300ms }
  - { name: conns, key: [header:X-API-Key], algorithm: concurrency, limit: 1 }
  - { name: rate, match: { path: /rated }, key: [header:X-API-Key], algorithm: fixed_window, limit: 1, period: 1h }
`
			f := newPlacesFixture(t, yaml, st.opts(t))
			ctx := context.Background()
			ip := "192.0.2.10"

			// The client goes away while its request is at the upstream.
			cctx, cancel := context.WithCancel(ctx)
			gone := f.start(cctx, "/x?block=1", "A")
			f.arrive()
			if f.inFlight("per-ip", ip) != 1 || f.inFlight("conns", "A") != 1 {
				t.Fatal("the places were not taken")
			}
			// A second request of A: per-ip has room, conns does not; per-ip's place is
			// given back.
			res := f.do(ctx, "/x", "A")
			if p := readProblem(t, res, http.StatusTooManyRequests); p.ViolatedPolicies[0] != "conns" {
				t.Fatalf("violated %v", p.ViolatedPolicies)
			}
			if n := f.inFlight("per-ip", ip); n != 1 {
				t.Fatalf("per-ip holds %d places after a request that conns refused, want 1", n)
			}
			cancel()
			<-gone
			testenv.WaitFor(t, 5*time.Second, "the places of a request whose client went away", func() bool {
				return f.inFlight("per-ip", ip) == 0 && f.inFlight("conns", "A") == 0
			})

			// A request that a rate rule refuses takes no place.
			held := f.start(ctx, "/rated?block=1", "B")
			f.arrive()
			res = f.do(ctx, "/rated", "C") // C's first: allowed by rate, and by the caps
			if res.StatusCode != http.StatusOK {
				t.Fatalf("key C: %d", res.StatusCode)
			}
			res = f.do(ctx, "/rated", "C") // over the rate limit
			if p := readProblem(t, res, http.StatusTooManyRequests); p.ViolatedPolicies[0] != "rate" || res.Header.Get("Retry-After") == "" {
				t.Fatalf("rate 429: %+v, Retry-After %q", p, res.Header.Get("Retry-After"))
			}
			if f.inFlight("per-ip", ip) != 1 || f.inFlight("conns", "C") != 0 {
				t.Fatalf("a request refused by the rate rule took a place: per-ip %d, conns C %d",
					f.inFlight("per-ip", ip), f.inFlight("conns", "C"))
			}
			f.up.release <- struct{}{}
			status(t, held, http.StatusOK)

			// The upstream is down: 502, places back.
			down := newPlacesFixture(t, connsYAML, st.opts(t))
			down.up.Close()
			if res := down.do(ctx, "/x", "A"); res.StatusCode != http.StatusBadGateway {
				t.Fatalf("upstream down: %d, want 502", res.StatusCode)
			}
			if n := down.inFlight("conns", "A"); n != 0 {
				t.Fatalf("in flight %d after a 502", n)
			}

			// The rule's timeout cuts the forwarding off: 504 after 300ms, places back.
			start := time.Now()
			timedOut := f.start(ctx, "/x?block=1", "D")
			f.arrive()
			status(t, timedOut, http.StatusGatewayTimeout)
			if e := time.Since(start); e < 300*time.Millisecond {
				t.Fatalf("cut off after %v, before the rule's timeout of 300ms", e)
			}
			if f.inFlight("per-ip", ip) != 0 || f.inFlight("conns", "D") != 0 {
				t.Fatal("places still held after the timeout")
			}
		})
	}
}

// TestConcurrencyHold: a place is held for the rule's timeout plus holdMargin, so that one
// whose ingress died comes back by itself; the forwarded request is bounded by the timeout.
func TestConcurrencyHold(t *testing.T) {
	rs := testenv.Redis(t)
	rdb := storeClient(t, rs)
	prefix := testenv.Prefix(t)
	f := newPlacesFixture(t, `
rules:
  - { name: conns, key: [header:X-API-Key], algorithm: concurrency, limit: 1, timeout: 20s }
`, Options{Limiter: limit.NewRedis(rdb, limit.RedisConfig{Prefix: prefix}),
		Places: inflight.NewRedis(rdb, inflight.WithPrefix(prefix+"inflight:"))})
	done := f.start(context.Background(), "/x?block=1", "A")
	f.arrive()
	key := prefix + "inflight:conns\x00A"
	scores, err := rs.Client.ZRangeWithScores(context.Background(), key, 0, -1).Result()
	if err != nil || len(scores) != 1 {
		t.Fatalf("ZRANGE %q: %v, %v", key, scores, err)
	}
	serverNow := rs.Client.Time(context.Background()).Val()
	hold := time.UnixMicro(int64(scores[0].Score)).Sub(serverNow)
	if hold <= 20*time.Second || hold > 20*time.Second+holdMargin {
		t.Fatalf("the place expires in %v; want the timeout 20s plus at most %v", hold, holdMargin)
	}
	f.up.release <- struct{}{}
	status(t, done, http.StatusOK)
	if n, _ := rs.Client.Exists(context.Background(), key).Result(); n != 0 {
		t.Fatal("the key of a released place is still in Redis")
	}
}

// TestConcurrencyStoreDown: with Redis gone, a rule that fails open caps each ingress on its
// own (the in-process fallback), and one that fails closed answers 503.
func TestConcurrencyStoreDown(t *testing.T) {
	rs := testenv.Redis(t)
	rdb := storeClient(t, rs)
	prefix := testenv.Prefix(t)
	f := newPlacesFixture(t, `
rules:
  - { name: open, match: { path: /open }, key: [header:X-API-Key], algorithm: concurrency, limit: 1 }
  - { name: closed, match: { path: /closed }, key: [header:X-API-Key], algorithm: concurrency, limit: 1, on_store_error: deny }
`, Options{Limiter: limit.NewRedis(rdb, limit.RedisConfig{Prefix: prefix}),
		Places: inflight.NewRedis(rdb, inflight.WithPrefix(prefix+"inflight:"))})
	rs.Stop()
	ctx := context.Background()
	held := f.start(ctx, "/open?block=1", "A")
	f.arrive()
	res := f.do(ctx, "/open", "A")
	if p := readProblem(t, res, http.StatusTooManyRequests); p.ViolatedPolicies[0] != "open" {
		t.Fatalf("violated %v", p.ViolatedPolicies)
	}
	readProblem(t, f.do(ctx, "/closed", "A"), http.StatusServiceUnavailable)
	f.up.release <- struct{}{}
	status(t, held, http.StatusOK)
	if n := f.do(ctx, "/open", "A"); n.StatusCode != http.StatusOK {
		t.Fatalf("after the fallback's place came back: %d", n.StatusCode)
	}
	if got := metric(t, f.reg, "sluice_decisions_total", "rule", "open", "outcome", "fail_open"); got < 2 {
		t.Errorf("fail_open decisions %v, want the fallback's", got)
	}
}

// TestConcurrencyDefers: a request over a concurrency rule with on_limit: enqueue is deferred to
// the rule's queue (202), as over any other rule, and holds no place; one under it is forwarded.
func TestConcurrencyDefers(t *testing.T) {
	f := newQueueFixture(t, `
queues:
  - { name: slow, rate: 10/s }
rules:
  - { name: conns, key: [header:X-API-Key], algorithm: concurrency, limit: 1, on_limit: enqueue, queue: slow }
`)
	ctx := context.Background()
	// The key's one place is held (by a request of another ingress, say).
	caps := []inflight.Cap{{Key: "conns\x00k1", Limit: 1}}
	held, err := f.srv.gate.places.Acquire(ctx, caps, time.Minute)
	if err != nil || !held.Acquired {
		t.Fatalf("Acquire: %+v, %v", held, err)
	}
	res := f.do("POST", "/api/work", strings.NewReader(`{"n":1}`), "X-API-Key", "k1", "Content-Type", "application/json")
	a := accepted(t, res, "slow")
	if res.Header.Get("RateLimit") != `"conns";r=0` {
		t.Errorf("deferral's RateLimit %q", res.Header.Get("RateLimit"))
	}
	jobs := f.fetch(t, "slow", 1)
	if jobs[0].ID != a.ID || string(jobs[0].Body) != `{"n":1}` {
		t.Fatalf("job %+v, want the deferred request", jobs[0])
	}
	if n, _ := f.srv.gate.places.InFlight(ctx, "conns\x00k1"); n[0] != 1 {
		t.Fatalf("in flight %v after a deferral, want the 1 held before", n)
	}
	f.srv.gate.places.Release(ctx, held.Lease)
	readEchoed(t, f.do("POST", "/api/work", strings.NewReader(`{"n":2}`), "X-API-Key", "k1"))
	if got := metric(t, f.reg, "sluice_decisions_total", "rule", "conns", "outcome", "enqueued"); got != 1 {
		t.Errorf("enqueued decisions %v, want 1", got)
	}
}
