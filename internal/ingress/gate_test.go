package ingress

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/limit"
)

// algorithmsYAML has one rule per algorithm, 3 requests per hour each, keyed by client IP.
const algorithmsYAML = `
rules:
  - { name: tb,  match: { path: /tb },  algorithm: token_bucket,   limit: 3, period: 1h }
  - { name: lb,  match: { path: /lb },  algorithm: leaky_bucket,   limit: 3, period: 1h, burst: 3 }
  - { name: fw,  match: { path: /fw },  algorithm: fixed_window,   limit: 3, period: 1h }
  - { name: sl,  match: { path: /sl },  algorithm: sliding_log,    limit: 3, period: 1h }
  - { name: sw,  match: { path: /sw },  algorithm: sliding_window, limit: 3, period: 1h }
  - { name: gc,  match: { path: /gc },  algorithm: gcra,           limit: 3, period: 1h }
`

// limiters returns the limiters the tables run against: the in-process one and a real
// redis-server, both on the fixture's fixed clock.
func limiters(t *testing.T) map[string]func(now func() time.Time) limit.Limiter {
	rs := testenv.Redis(t)
	return map[string]func(now func() time.Time) limit.Limiter{
		"memory": func(now func() time.Time) limit.Limiter { return nil },
		"redis": func(now func() time.Time) limit.Limiter {
			return limit.NewRedis(storeClient(t, rs), limit.RedisConfig{Prefix: testenv.Prefix(t), Now: now})
		},
	}
}

// TestAlgorithms checks status, headers and body of every algorithm against both limiters:
// three requests pass with the quota counting down, the fourth is a 429 whose Retry-After
// says when the algorithm admits again.
func TestAlgorithms(t *testing.T) {
	// At the fixed clock (12:10:00), after three requests, when does each admit again?
	retry := map[string][2]int64{ // [lo, hi] seconds
		"tb": {1200, 1200}, // one token per 20 minutes
		"lb": {1200, 1200}, // the bucket leaks one unit per 20 minutes
		"gc": {1200, 1200}, // emission interval 20 minutes
		"fw": {3000, 3000}, // the window ends at 13:00
		"sl": {3600, 3600}, // the oldest entry leaves the log in an hour
		"sw": {3000, 3001}, // once the window turns, the weighted old count is below 3
	}
	for store, mk := range limiters(t) {
		t.Run(store, func(t *testing.T) {
			c := &clock{t: epoch}
			f := newFixture(t, algorithmsYAML, Options{Limiter: mk(c.Now), Now: c.Now})
			for name, want := range retry {
				t.Run(name, func(t *testing.T) {
					for i := range 3 {
						res := f.do("GET", "/"+name, nil)
						readEchoed(t, res)
						p := readPolicy(t, res.Header)
						if p.name != name || p.q != 3 || p.w != 3600 || p.r != int64(2-i) {
							t.Errorf("request %d: policy %+v, want %s q=3 w=3600 r=%d", i+1, p, name, 2-i)
						}
						if p.t < 1 || p.t > 7200 { // a sliding window is whole again only once the weighted old window is gone
							t.Errorf("request %d: t=%d, want 1..7200", i+1, p.t)
						}
					}
					res := f.do("GET", "/"+name, nil)
					pb := readProblem(t, res, http.StatusTooManyRequests)
					ra, err := strconv.ParseInt(res.Header.Get("Retry-After"), 10, 64)
					if err != nil || ra < want[0] || ra > want[1] {
						t.Errorf("Retry-After %q, want %d..%d", res.Header.Get("Retry-After"), want[0], want[1])
					}
					if x := res.Header.Get("X-RateLimit-Retry-After"); x != strconv.FormatInt(ra, 10) {
						t.Errorf("X-RateLimit-Retry-After %q, want %d", x, ra)
					}
					if pb.Type != QuotaExceededType || pb.RetryAfter != ra || len(pb.ViolatedPolicies) != 1 || pb.ViolatedPolicies[0] != name || pb.Detail == "" {
						t.Errorf("problem %+v", pb)
					}
					if p := readPolicy(t, res.Header); p.r != 0 || p.name != name {
						t.Errorf("429 policy %+v, want r=0", p)
					}
					if got := metric(t, f.reg, "sluice_decisions_total", "rule", name, "outcome", "allowed"); got != 3 {
						t.Errorf("allowed decisions %v, want 3", got)
					}
					if got := metric(t, f.reg, "sluice_decisions_total", "rule", name, "outcome", "rejected"); got != 1 {
						t.Errorf("rejected decisions %v, want 1", got)
					}
					// Another client has its own quota.
					r := httptestRequest("GET", "/"+name, "198.51.100.99:1")
					if res := serve(f.handler, r); res.StatusCode != http.StatusOK {
						t.Errorf("another client: status %d, want 200", res.StatusCode)
					}
				})
			}
		})
	}
}

// TestMostRestrictive checks that every matching rule is charged and the tightest decides.
func TestMostRestrictive(t *testing.T) {
	f := newFixture(t, `
rules:
  - { name: wide,   match: { path: /api/* }, algorithm: token_bucket, limit: 5, period: 1m }
  - { name: narrow, match: { methods: [POST], path: /api/orders }, algorithm: fixed_window, limit: 2, period: 1m }
  - { name: other,  match: { path: /elsewhere }, algorithm: fixed_window, limit: 1, period: 1m }
`, Options{})
	// A GET matches only "wide".
	if p := readPolicy(t, f.do("GET", "/api/orders", nil).Header); p.name != "wide" || p.r != 4 {
		t.Fatalf("GET: policy %+v, want wide r=4", p)
	}
	// POSTs match both; the headers report the one closest to exhaustion.
	res := f.do("POST", "/api/orders", nil)
	if p := readPolicy(t, res.Header); p.name != "narrow" || p.r != 1 {
		t.Fatalf("POST 1: policy %+v, want narrow r=1", p)
	}
	res = f.do("POST", "/api/orders", nil)
	if p := readPolicy(t, res.Header); p.name != "narrow" || p.r != 0 {
		t.Fatalf("POST 2: policy %+v, want narrow r=0", p)
	}
	res = f.do("POST", "/api/orders", nil)
	pb := readProblem(t, res, http.StatusTooManyRequests)
	if strings.Join(pb.ViolatedPolicies, ",") != "narrow" {
		t.Fatalf("violated %v, want [narrow]", pb.ViolatedPolicies)
	}
	// "wide" was charged by every request, the rejected one included: 1 left, now 0.
	res = f.do("GET", "/api/x", nil)
	if p := readPolicy(t, res.Header); p.name != "wide" || p.r != 0 {
		t.Fatalf("GET after: policy %+v, want wide r=0", p)
	}
	// Now both are exceeded: both are named, and Retry-After is the longer wait.
	f.clock.Advance(30 * time.Second)    // fixed window: 30 s left; token bucket: +2.5 tokens
	for _, want := range []int64{1, 0} { // wide has 2.5 tokens: two GETs pass
		res = f.do("GET", "/api/x", nil)
		if p := readPolicy(t, res.Header); res.StatusCode != http.StatusOK || p.name != "wide" || p.r != want {
			t.Fatalf("GET after 30s: status %d, policy %+v; want 200, wide r=%d", res.StatusCode, p, want)
		}
	}
	res = f.do("POST", "/api/orders", nil)
	pb = readProblem(t, res, http.StatusTooManyRequests)
	if strings.Join(pb.ViolatedPolicies, ",") != "wide,narrow" {
		t.Fatalf("violated %v, want [wide narrow]", pb.ViolatedPolicies)
	}
	if pb.RetryAfter != 30 { // narrow's window ends in 30 s; wide refills a token in 6 s
		t.Fatalf("retry_after %d, want 30", pb.RetryAfter)
	}
}

// TestShadow checks that shadow rules, and every rule under global shadow, charge and report
// but never block, and are counted as shadow.
func TestShadow(t *testing.T) {
	const rules = `
rules:
  - { name: soft, match: { path: /soft }, algorithm: fixed_window, limit: 1, period: 1m, shadow: true }
  - { name: hard, match: { path: /hard }, algorithm: fixed_window, limit: 1, period: 1m }
`
	for _, global := range []bool{false, true} {
		t.Run("global="+strconv.FormatBool(global), func(t *testing.T) {
			yaml := rules
			if global {
				yaml = "shadow: true\n" + rules
			}
			f := newFixture(t, yaml, Options{})
			for i := range 3 {
				res := f.do("GET", "/soft", nil)
				readEchoed(t, res)
				if p := readPolicy(t, res.Header); p.r != 0 {
					t.Fatalf("soft request %d: r=%d, want 0", i, p.r)
				}
			}
			if got := metric(t, f.reg, "sluice_decisions_total", "rule", "soft", "outcome", "shadow"); got != 2 {
				t.Fatalf("shadow decisions %v, want 2", got)
			}
			f.do("GET", "/hard", nil)
			res := f.do("GET", "/hard", nil)
			want := http.StatusTooManyRequests
			if global {
				want = http.StatusOK
			}
			if res.StatusCode != want {
				t.Fatalf("hard rule over its limit: status %d, want %d", res.StatusCode, want)
			}
		})
	}
}

// TestAnonymousKey checks that requests without the key header share one bucket, so that
// leaving the header out never escapes the limit.
func TestAnonymousKey(t *testing.T) {
	f := newFixture(t, `
rules:
  - { name: per-key, match: { path: /api/* }, key: [header:X-API-Key], algorithm: fixed_window, limit: 2, period: 1m }
  - { name: per-tenant, match: { path: /t/* }, key: [query:tenant, method], algorithm: fixed_window, limit: 1, period: 1m }
`, Options{})
	f.do("GET", "/api/a", nil)
	f.do("GET", "/api/b", nil, "X-API-Key", "") // empty is absent
	f.peerAddr = "198.51.100.7:1"               // another client, still without a key
	if res := f.do("GET", "/api/c", nil); res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third request without a key: status %d, want 429", res.StatusCode)
	}
	for _, k := range []string{"alice", "bob"} {
		if res := f.do("GET", "/api/a", nil, "X-API-Key", k); res.StatusCode != http.StatusOK {
			t.Fatalf("key %s: status %d, want 200", k, res.StatusCode)
		}
	}
	// Query parts: no tenant is one tenant.
	f.do("GET", "/t/x", nil)
	if res := f.do("GET", "/t/x?other=1", nil); res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second request without tenant: status %d, want 429", res.StatusCode)
	}
	if res := f.do("GET", "/t/x?tenant=acme", nil); res.StatusCode != http.StatusOK {
		t.Fatalf("tenant acme: status %d, want 200", res.StatusCode)
	}
	if res := f.do("POST", "/t/x?tenant=acme", nil); res.StatusCode != http.StatusOK {
		t.Fatalf("tenant acme, another method: status %d, want 200", res.StatusCode)
	}
}

// TestTrustedProxy checks that X-Forwarded-For and Forwarded are believed only from trusted
// peers.
func TestTrustedProxy(t *testing.T) {
	f := newFixture(t, `
trusted_proxies: [10.0.0.0/8, "2001:db8::/32"]
rules:
  - { name: per-ip, match: { path: /* }, key: [ip], algorithm: fixed_window, limit: 1, period: 1m }
`, Options{})
	type step struct {
		peer, header, value string
		want                int
	}
	for i, s := range []step{
		// From a trusted proxy, the client is the right-most untrusted hop.
		{"10.0.0.1:5000", "X-Forwarded-For", "203.0.113.1", 200},
		{"10.0.0.2:5000", "X-Forwarded-For", "203.0.113.1", 429},                        // the same client via another proxy
		{"10.0.0.1:5000", "X-Forwarded-For", "203.0.113.1, 203.0.113.2, 10.9.9.9", 200}, // .2 is the client
		{"10.0.0.1:5000", "X-Forwarded-For", "203.0.113.2", 429},
		{"[2001:db8::1]:5000", "Forwarded", `for="[2001:db8:cafe::17]:4711"`, 200}, // db8:cafe is trusted too
		{"[2001:db8::1]:5000", "Forwarded", `for=198.51.100.5;proto=https, for="[2001:db8::9]"`, 200},
		{"10.0.0.1:5000", "X-Forwarded-For", "198.51.100.5", 429},
		{"10.0.0.1:5000", "X-Forwarded-For", "::ffff:198.51.100.5", 429}, // IPv4-mapped is the same client
		// From an untrusted peer, a spoofed header changes nothing: the peer is the client.
		{"192.0.2.50:5000", "X-Forwarded-For", "203.0.113.77", 200},
		{"192.0.2.50:5000", "X-Forwarded-For", "203.0.113.78", 429},
		{"192.0.2.50:5000", "Forwarded", "for=203.0.113.79", 429},
		// A malformed hop from a trusted proxy falls back to the peer.
		{"10.0.0.3:5000", "X-Forwarded-For", "203.0.113.90, not-an-ip", 200},
		{"10.0.0.3:5000", "X-Forwarded-For", "203.0.113.91, garbage", 429},
	} {
		r := httptestRequest("GET", "/x", s.peer)
		r.Header.Set(s.header, s.value)
		if res := serve(f.handler, r); res.StatusCode != s.want {
			t.Errorf("step %d %+v: status %d", i, s, res.StatusCode)
		}
	}
}

// TestReload checks that new limits take effect at once and removed rules stop limiting,
// and that an unusable config is refused and the old one kept.
func TestReload(t *testing.T) {
	f := newFixture(t, `
rules:
  - { name: r1, match: { path: /a }, algorithm: fixed_window, limit: 1, period: 1m }
`, Options{})
	f.do("GET", "/a", nil)
	if res := f.do("GET", "/a", nil); res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("before reload: status %d, want 429", res.StatusCode)
	}
	// A higher limit on the same rule keeps its count (1 used) and admits two more.
	if err := f.srv.Reload(parseConfig(t, f.up.URL, `
rules:
  - { name: r1, match: { path: /a }, algorithm: fixed_window, limit: 3, period: 1m }
  - { name: r2, match: { path: /b }, algorithm: fixed_window, limit: 1, period: 1m }
`)); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		res := f.do("GET", "/a", nil)
		if res.StatusCode != http.StatusOK || readPolicy(t, res.Header).q != 3 {
			t.Fatalf("after reload, request %d: status %d, policy %q", i, res.StatusCode, res.Header.Get("RateLimit-Policy"))
		}
	}
	if res := f.do("GET", "/a", nil); res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("after reload, over the new limit: status %d, want 429", res.StatusCode)
	}
	f.do("GET", "/b", nil)
	if res := f.do("GET", "/b", nil); res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("new rule r2: status %d, want 429", res.StatusCode)
	}

	// A config that cannot be used is refused; the rules stay.
	bad := parseConfig(t, f.up.URL, "rules: []\n")
	bad.Rules = []config.Rule{{Name: "broken", Algorithm: "nope", Limit: 1, Period: time.Second}}
	if err := f.srv.Reload(bad); err == nil || !strings.Contains(err.Error(), "broken") {
		t.Fatalf("Reload(unusable) = %v, want an error naming the rule", err)
	}
	if res := f.do("GET", "/b", nil); res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("after a refused reload: status %d, want 429", res.StatusCode)
	}

	// Removed rules stop limiting, and their responses carry no rate-limit headers.
	if err := f.srv.Reload(parseConfig(t, f.up.URL, "rules: []\n")); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		res := f.do("GET", "/b", nil)
		readEchoed(t, res)
		if res.Header.Get("RateLimit-Policy") != "" || res.Header.Get("X-RateLimit-Limit") != "" {
			t.Fatalf("no rule: rate-limit headers %v", res.Header)
		}
	}
}

// TestPathTraversal checks that rules see, and the upstream gets, the cleaned path, and that
// encoded dot segments are refused.
func TestPathTraversal(t *testing.T) {
	f := newFixture(t, `
rules:
  - { name: admin, match: { path: /admin }, algorithm: fixed_window, limit: 1, period: 1m }
  - { name: api,   match: { path: /api/* }, algorithm: fixed_window, limit: 100, period: 1m }
`, Options{})
	res := f.do("GET", "/api/../admin", nil)
	if e := readEchoed(t, res); e.Path != "/admin" {
		t.Fatalf("upstream got %q, want /admin", e.Path)
	}
	if p := readPolicy(t, res.Header); p.name != "admin" {
		t.Fatalf("policy %q, want admin: the cleaned path is matched", p.name)
	}
	if res := f.do("GET", "/api/./x/../../admin", nil); res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second way to /admin: status %d, want 429", res.StatusCode)
	}
	// ".." cannot climb out of the /api/* prefix and stay limited by it.
	res = f.do("GET", "/api/../secret", nil)
	if e := readEchoed(t, res); e.Path != "/secret" || res.Header.Get("RateLimit-Policy") != "" {
		t.Fatalf("upstream got %q with policy %q, want /secret and no policy", e.Path, res.Header.Get("RateLimit-Policy"))
	}
	// Repeated slashes are merged; a trailing slash is kept; an already-clean path keeps its
	// encoding.
	for target, want := range map[string]string{
		"//admin2//x/": "/admin2/x/",
		"/api/a%2Fb":   "/api/a%2Fb",
		"/api/x?q=1":   "/api/x",
	} {
		if e := readEchoed(t, f.do("GET", target, nil)); e.Path != want {
			t.Errorf("%s: upstream got %q, want %q", target, e.Path, want)
		}
	}
	for _, target := range []string{"/api/%2e%2e/admin", "/api/%2E./admin", "/api%2f..%2fadmin", "/api/.%2e"} {
		readProblem(t, f.do("GET", target, nil), http.StatusBadRequest)
	}
}

// TestNoRules checks that without rules everything is forwarded, without headers.
func TestNoRules(t *testing.T) {
	f := newFixture(t, "rules: []\n", Options{})
	res := f.do("POST", "/anything?x=1", strings.NewReader("hi"))
	e := readEchoed(t, res)
	if e.Method != "POST" || e.Path != "/anything" || e.Query != "x=1" || e.Body != "hi" {
		t.Fatalf("upstream got %+v", e)
	}
	if res.Header.Get("RateLimit") != "" {
		t.Fatalf("RateLimit header without rules: %q", res.Header.Get("RateLimit"))
	}
}
