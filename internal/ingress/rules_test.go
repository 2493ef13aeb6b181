package ingress

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/limit"
)

// TestMatcher checks that a compiled matcher answers as config.Match.Matches does.
func TestMatcher(t *testing.T) {
	patterns := []string{"", "/*", "/api/*", "/api", "/api/", "/api/orders", "/API/Orders/", "/a/b/*", "/x*", "/"}
	paths := []string{"/", "/api", "/api/", "/api/orders", "/api/orders/", "/Api/Orders/", "/api/orders//", "/apix", "/api/orders/1", "/a/b", "/a/b/c", "/a/bc", "/x", "/x*", "/xy", ""}
	methodSets := [][]string{nil, {"GET"}, {"POST", "PUT"}}
	for _, pat := range patterns {
		for _, ms := range methodSets {
			for _, fold := range []bool{false, true} {
				m := config.Match{Methods: ms, Path: pat, CaseInsensitive: fold}
				mt := compileMatch(m, nil)
				for _, path := range paths {
					for _, method := range []string{"GET", "HEAD", "POST", "get", "DELETE"} {
						if got, want := mt.matches(method, path), m.Matches(method, path); got != want {
							t.Errorf("pattern %q methods %v fold %v: %s %q = %v, Matches says %v", pat, ms, fold, method, path, got, want)
						}
					}
				}
			}
		}
	}
}

// TestSameRouteCharged checks that requests an upstream routes as a rule's are charged under
// it: HEAD under a GET-only rule (Go's ServeMux and most frameworks serve HEAD with the GET
// handler), and an exact path with a trailing slash. Before, both passed uncharged.
func TestSameRouteCharged(t *testing.T) {
	f := newFixture(t, `
rules:
  - {name: read-order, match: {methods: [GET], path: /api/orders}, algorithm: fixed_window, limit: 1, period: 1h}
`, Options{})
	if res := f.do("GET", "/api/orders", nil); res.StatusCode != http.StatusOK {
		t.Fatalf("first GET: %d", res.StatusCode)
	}
	for _, c := range []struct{ method, path string }{
		{"HEAD", "/api/orders"}, {"GET", "/api/orders/"}, {"head", "/api/orders/"},
	} {
		res := f.do(c.method, c.path, nil)
		if res.StatusCode != http.StatusTooManyRequests {
			t.Errorf("%s %s: %d, want 429: the rule's route, charged under it", c.method, c.path, res.StatusCode)
		}
	}
	if res := f.do("POST", "/api/orders", nil); res.StatusCode != http.StatusOK {
		t.Errorf("POST: %d, want 200: not under a GET rule", res.StatusCode)
	}
}

// TestHeaderKeyName checks that a header key part of a hand-built config (whose name is not
// canonical, as a config file's always is) reads the header whatever the case it is written
// in: each API key has its own quota.
func TestHeaderKeyName(t *testing.T) {
	cfg := parseConfig(t, "http://127.0.0.1:1", "rules: []\n")
	cfg.Rules = []config.Rule{{Name: "per-key", Key: []config.KeyPart{{Kind: config.KeyHeader, Name: "x-api-KEY"}},
		Algorithm: "fixed_window", Limit: 1, Period: 60e9}}
	g := testGate(t, cfg, Options{Registerer: prometheus.NewRegistry()})
	e := echo.New()
	e.Pre(gateMiddleware(g))
	e.Any("/*", func(c echo.Context) error { return c.NoContent(http.StatusOK) })
	status := func(key string) int {
		r := httptestRequest("GET", "/x", "192.0.2.1:1")
		r.Header.Set("X-Api-Key", key)
		return serve(e, r).StatusCode
	}
	if s := status("alice"); s != http.StatusOK {
		t.Fatalf("alice: %d", s)
	}
	if s := status("bob"); s != http.StatusOK {
		t.Fatalf("bob: %d, want 200: a key of its own", s)
	}
	if s := status("alice"); s != http.StatusTooManyRequests {
		t.Fatalf("alice again: %d, want 429", s)
	}
}

// TestCompileRule checks each step of compiling a rule of a hand-built config (config.Load
// rejects all of these first): the first thing wrong with a rule is the error, and a good rule
// comes out with its defaults and canonical header names.
func TestCompileRule(t *testing.T) {
	cfg := &config.Config{}
	queues := map[string]*config.Queue{"q": {Name: "q"}}
	good := config.Rule{Name: "r", Algorithm: limit.FixedWindow, Limit: 1, Period: time.Second}
	with := func(f func(*config.Rule)) config.Rule {
		r := good
		f(&r)
		return r
	}
	for _, tc := range []struct {
		name string
		rule config.Rule
		want string
	}{
		{"no name", with(func(r *config.Rule) { r.Name = "" }), "name is required"},
		{"bad UTF-8 name", with(func(r *config.Rule) { r.Name = "\xff" }), "not valid UTF-8"},
		{"key part without its name", with(func(r *config.Rule) { r.Key = []config.KeyPart{{Kind: config.KeyHeader}} }), `key part "header" needs a name`},
		{"unknown key part", with(func(r *config.Rule) { r.Key = []config.KeyPart{{Kind: "cookie", Name: "x"}} }), `unknown key part "cookie"`},
		{"unknown action", with(func(r *config.Rule) { r.Action = "drop" }), `unknown action "drop"`},
		{"unknown on_limit", with(func(r *config.Rule) { r.OnLimit = "drop" }), `unknown on_limit "drop"`},
		{"invalid limit", with(func(r *config.Rule) { r.Limit = 0 }), "limit must be > 0"},
		{"limit before queue", with(func(r *config.Rule) { r.Limit, r.OnLimit = 0, config.OnLimitEnqueue }), "limit must be > 0"},
		{"no such queue", with(func(r *config.Rule) { r.OnLimit, r.Queue = config.OnLimitEnqueue, "nope" }), `no queue named "nope"`},
		{"unknown on_store_error", with(func(r *config.Rule) { r.OnStoreError = "maybe" }), `unknown on_store_error "maybe"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := compileRule(cfg, tc.rule, queues); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("compileRule = %v, want an error containing %q", err, tc.want)
			}
		})
	}

	r, err := compileRule(cfg, with(func(r *config.Rule) {
		r.Key = []config.KeyPart{{Kind: config.KeyHeader, Name: "x-api-KEY"}, {Kind: config.KeyMethod}}
		r.OnStoreError = config.StoreErrorDeny
		r.Lease = 10
	}), queues)
	if err != nil {
		t.Fatal(err)
	}
	if r.key[0].Name != "X-Api-Key" || r.key[1].Kind != config.KeyMethod || r.failOpen || !r.hasLimit || r.leases == nil ||
		r.keyPrefix != "r\x00" || r.policy != `"r";q=1;w=1` || r.limitText != "1" {
		t.Fatalf("compiled rule %+v", r)
	}
	// Defaults: the key is the client address, the store-error mode allow; an action: enqueue
	// rule without an algorithm has no limit; a long name is hashed in keys.
	long := strings.Repeat("n", maxRuleInKey+1)
	r, err = compileRule(cfg, config.Rule{Name: long, Action: config.ActionEnqueue, Queue: "q"}, queues)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.key) != 1 || r.key[0].Kind != config.KeyIP || !r.failOpen || r.hasLimit || !r.actionEnqueue ||
		r.keyPrefix[0] != hashMarker || len(r.keyPrefix) != 1+32+1 || r.policy != "" {
		t.Fatalf("compiled rule %+v", r)
	}
}
