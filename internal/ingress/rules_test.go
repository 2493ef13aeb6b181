package ingress

import (
	"net/http"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/config"
)

// TestMatcher checks that a compiled matcher answers as config.Match.Matches does.
func TestMatcher(t *testing.T) {
	patterns := []string{"", "/*", "/api/*", "/api", "/api/", "/api/orders", "/a/b/*", "/x*"}
	paths := []string{"/", "/api", "/api/", "/api/orders", "/apix", "/api/orders/1", "/a/b", "/a/b/c", "/a/bc", "/x", "/x*", "/xy", ""}
	methodSets := [][]string{nil, {"GET"}, {"POST", "PUT"}}
	for _, pat := range patterns {
		for _, ms := range methodSets {
			m := config.Match{Methods: ms, Path: pat}
			mt := compileMatch(m)
			for _, path := range paths {
				for _, method := range []string{"GET", "POST", "get", "DELETE"} {
					if got, want := mt.matches(method, path), m.Matches(method, path); got != want {
						t.Errorf("pattern %q methods %v: %s %q = %v, Matches says %v", pat, ms, method, path, got, want)
					}
				}
			}
		}
	}
}

// TestHeaderKeyName checks that a header key part of a hand-built config (whose name is not
// canonical, as a config file's always is) reads the header whatever the case it is written
// in: each API key has its own quota.
func TestHeaderKeyName(t *testing.T) {
	cfg := parseConfig(t, "http://127.0.0.1:1", "rules: []\n")
	cfg.Rules = []config.Rule{{Name: "per-key", Key: []config.KeyPart{{Kind: config.KeyHeader, Name: "x-api-KEY"}},
		Algorithm: "fixed_window", Limit: 1, Period: 60e9}}
	g, err := NewGate(cfg, Options{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	e.Pre(g.Middleware())
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
