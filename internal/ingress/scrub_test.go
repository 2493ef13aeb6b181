package ingress

import (
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestClientSluiceHeaders checks that a client's own Sluice-* headers, and the underscore
// spellings of Sluice-* and Idempotency-Key, reach the upstream neither when the request is
// forwarded nor when it is deferred; the client's Idempotency-Key itself does (the worker
// delivers it on purpose).
func TestClientSluiceHeaders(t *testing.T) {
	f := newQueueFixture(t, deferYAML)
	send := func() *http.Response {
		return f.do("POST", "/api/orders", strings.NewReader(`{"sku":1}`), "X-API-Key", "k1",
			"Sluice-Attempt", "9", "Sluice-Job", "forged", "sluice_attempt", "7", "SLUICE-PAUSE", "1",
			"Idempotency-Key", "order-1", "Idempotency_Key", "other", "X-Trace", "t1")
	}
	check := func(where string, h http.Header) {
		t.Helper()
		for name := range h {
			if strings.HasPrefix(strings.ToLower(name), "sluice") || strings.EqualFold(name, "Idempotency_Key") {
				t.Errorf("%s: the client's %s: %q passed on", where, name, h[name])
			}
		}
		if h.Get("Idempotency-Key") != "order-1" || h.Get("X-Trace") != "t1" {
			t.Errorf("%s: Idempotency-Key %q, X-Trace %q: the client's own headers must stay", where, h.Get("Idempotency-Key"), h.Get("X-Trace"))
		}
	}
	check("forwarded", readEchoed(t, send()).Header)
	accepted(t, send(), "orders")
	check("deferred", f.fetch(t, "orders", 1)[0].Header)
}

// TestUnderscoreKeyHeader checks that a header spelling a key header with underscores
// (X_API_Key beside X-API-Key), which CGI-style upstreams read as the key header, is refused:
// keyed by X-API-Key, a client could otherwise rotate it for fresh keys while the upstream
// believes X_API_Key. Before, it was forwarded and every request had a fresh key.
func TestUnderscoreKeyHeader(t *testing.T) {
	f := newFixture(t, `
queues: [{name: q, rate: 1/s, tenant: [header:X-Tenant]}]
rules:
  - {name: per-key, key: [header:X-API-Key], algorithm: fixed_window, limit: 1, period: 1h}
`, Options{})
	for i, hdr := range [][]string{
		{"X-API-Key", "fresh1", "X_API_Key", "victim"},
		{"X_Api_Key", "victim"},
		{"x_api-key", "victim"},
		{"X_Tenant", "t"},
	} {
		p := readProblem(t, f.do("GET", "/x", nil, hdr...), http.StatusBadRequest)
		if !strings.Contains(p.Detail, "X-Api-Key") && !strings.Contains(p.Detail, "X-Tenant") {
			t.Errorf("request %d: detail %q does not name the key header", i, p.Detail)
		}
	}
	// Underscores elsewhere are none of Sluice's business.
	readEchoed(t, f.do("GET", "/x", nil, "X-API-Key", "k", "X_Other", "1"))
}

// TestWarnsUntenantedQueue checks that the ingress warns, at start and on reload, of a queue
// fed by a rule keyed by API key that has no tenant: its clients share Idempotency-Keys.
func TestWarnsUntenantedQueue(t *testing.T) {
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(b []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(b)
	}), nil))
	cfg := parseConfig(t, "http://127.0.0.1:1", deferYAML)
	srv, err := New(cfg, Options{Logger: log, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	if err := srv.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(logs.String(), `has no tenant`); n != 2 || !strings.Contains(logs.String(), `\"orders\"`) {
		t.Fatalf("log %q: want the warning about queue orders at start and on reload", logs.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }
