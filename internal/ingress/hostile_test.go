package ingress

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/limit"
	"github.com/sluice-rl/sluice/queue"
)

// These tests play the attacker of the hostile-input review: each one failed on the ingress
// before it was fixed.

const tenantYAML = `
queues:
  - { name: shared, rate: 1/s, target: "POST http://127.0.0.1:1/x", tenant: [header:X-API-Key] }
  - { name: open, rate: 1/s, target: "POST http://127.0.0.1:1/x" }
`

// TestIdempotencyKeyScopedPerTenant: caller B reusing caller A's Idempotency-Key gets a job of
// its own (not A's id, not a 422 that tells the key exists), cannot read A's job, and A's
// repeat is still recognised.
func TestIdempotencyKeyScopedPerTenant(t *testing.T) {
	f := newQueueFixture(t, tenantYAML)
	submit := func(apiKey, body string) *http.Response {
		return f.do("POST", "/v1/queues/shared/jobs", strings.NewReader(body),
			"X-API-Key", apiKey, "Idempotency-Key", "order-1001", "Content-Type", "application/json")
	}
	a := accepted(t, submit("key-A", `{"n":1}`), "shared")
	res := submit("key-B", `{"n":2}`) // another tenant, another body: no 422
	b := accepted(t, res, "shared")
	if b.ID == a.ID || res.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("tenant B's submission replayed tenant A's job %s (got %s)", a.ID, b.ID)
	}
	if res := submit("key-A", `{"n":1}`); res.Header.Get("Idempotent-Replayed") != "true" || accepted(t, res, "shared").ID != a.ID {
		t.Fatal("tenant A's own repeat was not recognised")
	}
	if res := submit("key-A", `{"n":3}`); res.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("tenant A reusing its key for another body: %d, want 422", res.StatusCode)
	}
	for _, tc := range []struct {
		apiKey string
		want   int
	}{{"key-A", 200}, {"key-B", 404}, {"", 404}} {
		hdr := []string{}
		if tc.apiKey != "" {
			hdr = append(hdr, "X-API-Key", tc.apiKey)
		}
		res := f.do("GET", a.StatusURL, nil, hdr...)
		if res.StatusCode != tc.want {
			t.Errorf("GET tenant A's job as %q: %d, want %d", tc.apiKey, res.StatusCode, tc.want)
		}
		if tc.want == 404 {
			readProblem(t, res, 404)
		}
	}
	// A queue without tenant has one tenant: whoever has the id reads the job.
	o := accepted(t, f.do("POST", "/v1/queues/open/jobs", strings.NewReader("x"), "X-API-Key", "key-A"), "open")
	if res := f.do("GET", o.StatusURL, nil, "X-API-Key", "key-B"); res.StatusCode != 200 {
		t.Errorf("GET a job of a queue without tenants: %d, want 200", res.StatusCode)
	}
	// A repeated tenant header with two values is ambiguous: refused.
	res = f.do("POST", "/v1/queues/shared/jobs", strings.NewReader("x"), "X-API-Key", "key-A", "X-API-Key", "key-B")
	readProblem(t, res, http.StatusBadRequest)
}

const parseYAML = `
trusted_proxies: []
rules:
  - { name: post-only, match: { methods: [POST], path: /api/* }, key: [header:X-API-Key], algorithm: fixed_window, limit: 1, period: 1h }
  - { name: folded, match: { path: /admin/*, case_insensitive: true }, key: [const:all], algorithm: fixed_window, limit: 1, period: 1h }
  - { name: per-ip, match: { path: /ip }, key: [ip], algorithm: fixed_window, limit: 1, period: 1h }
`

// TestNoParsingDifferentials: the ingress and an upstream cannot be made to read one request
// two ways — a lower-case method, a second key value, a path written in another case or with
// ";" or "\", another address of the same IPv6 /64.
func TestNoParsingDifferentials(t *testing.T) {
	f := newFixture(t, parseYAML, Options{})
	status := func(res *http.Response) int { io.Copy(io.Discard, res.Body); return res.StatusCode }

	// Methods: "post" is POST, counted and forwarded as POST.
	if e := readEchoed(t, f.do("post", "/api/x", nil, "X-API-Key", "k1")); e.Method != "POST" {
		t.Fatalf("post forwarded as %q, want POST", e.Method)
	}
	if got := status(f.do("Post", "/api/x", nil, "X-API-Key", "k1")); got != 429 {
		t.Fatalf("a second request as Post: %d, want 429 (the POST rule must apply)", got)
	}
	// A second value of the key header cannot buy a fresh key; the same value twice is one.
	if got := status(f.do("POST", "/api/x", nil, "X-API-Key", "fresh", "X-API-Key", "k1")); got != 400 {
		t.Fatalf("two different X-API-Key values: %d, want 400", got)
	}
	if got := status(f.do("POST", "/api/x", nil, "X-API-Key", "k1", "X-API-Key", "k1")); got != 429 {
		t.Fatalf("X-API-Key k1 twice: %d, want 429 as for k1", got)
	}
	// Paths: case-insensitive matching on request, ";" and "\" refused.
	if got := status(f.do("GET", "/admin/a", nil)); got != 200 {
		t.Fatalf("first /admin request: %d", got)
	}
	if got := status(f.do("GET", "/ADMIN/a", nil)); got != 429 {
		t.Fatalf("/ADMIN/a under a case-insensitive /admin/* rule: %d, want 429", got)
	}
	for _, p := range []string{"/api;x", "/api%3Bx/y", "/api%5Cx"} {
		res := f.do("POST", p, nil, "X-API-Key", "k1")
		if res.StatusCode != 400 {
			t.Errorf("POST %s: %d, want 400", p, res.StatusCode)
		}
	}
	// IPv6: one /64 is one client.
	f.peerAddr = "[2001:db8:1:2::10]:5000"
	if got := status(f.do("GET", "/ip", nil)); got != 200 {
		t.Fatalf("first request of the /64: %d", got)
	}
	f.peerAddr = "[2001:db8:1:2:ffff::99]:5000"
	if got := status(f.do("GET", "/ip", nil)); got != 429 {
		t.Fatalf("another address of the same /64: %d, want 429", got)
	}
	f.peerAddr = "[2001:db8:1:3::10]:5000"
	if got := status(f.do("GET", "/ip", nil)); got != 200 {
		t.Fatalf("another /64: %d, want 200", got)
	}
}

// rawRequest writes raw to a new connection to addr and returns the status line's code.
func rawRequest(t *testing.T, addr, raw string) int {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	res.Body.Close()
	return res.StatusCode
}

// TestMalformedChunkedBody: a broken chunked body is the client's 400 on the job API and on a
// forwarded route, not a 500 or a 502 counted as an upstream error.
func TestMalformedChunkedBody(t *testing.T) {
	f := newQueueFixture(t, tenantYAML+`
rules:
  - { name: all, match: { path: /fwd/* }, key: [ip], algorithm: fixed_window, limit: 100, period: 1h }
`)
	ts := httptest.NewServer(f.handler)
	t.Cleanup(ts.Close)
	addr := ts.Listener.Addr().String()
	for _, target := range []string{"/v1/queues/open/jobs", "/fwd/x"} {
		raw := "POST " + target + " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\nZZ\r\n"
		if got := rawRequest(t, addr, raw); got != http.StatusBadRequest {
			t.Errorf("POST %s with bad chunked encoding: %d, want 400", target, got)
		}
	}
	if got := metric(t, f.reg, "sluice_upstream_errors_total"); got != 0 {
		t.Errorf("upstream errors %v, want 0", got)
	}
	if got := metric(t, f.reg, "sluice_request_body_errors_total", "reason", "malformed"); got != 2 {
		t.Errorf("malformed bodies counted %v, want 2", got)
	}
}

// TestStalledBodyCutOff: a body that stops arriving is cut off after the read timeout with a
// 408, and counted, instead of holding the connection (and an upstream one) open.
func TestStalledBodyCutOff(t *testing.T) {
	f := newQueueFixture(t, tenantYAML+`
rules:
  - { name: all, match: { path: /fwd/* }, key: [ip], algorithm: fixed_window, limit: 100, period: 1h }
`)
	ts := httptest.NewUnstartedServer(f.handler)
	ts.Config.ReadTimeout = 300 * time.Millisecond // what the process sets from read_timeout
	ts.Start()
	t.Cleanup(ts.Close)
	addr := ts.Listener.Addr().String()
	for _, target := range []string{"/v1/queues/open/jobs", "/fwd/x"} {
		start := time.Now()
		raw := "POST " + target + " HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nConnection: close\r\n\r\nonly part of it"
		if got := rawRequest(t, addr, raw); got != http.StatusRequestTimeout {
			t.Errorf("POST %s with a stalled body: %d, want 408", target, got)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("POST %s: the stalled body held the connection %v", target, d)
		}
	}
	testenv.WaitFor(t, 5*time.Second, "timeouts counted", func() bool {
		return metric(t, f.reg, "sluice_request_body_errors_total", "reason", "timeout") == 2
	})
}

// TestDeferredKeepsClientAddress: a deferred request carries the forwarding headers the
// ingress would have sent, so the upstream still learns the client's address.
func TestDeferredKeepsClientAddress(t *testing.T) {
	f := newQueueFixture(t, deferYAML)
	res := f.do("POST", "/reports", strings.NewReader("r"), "Accept-Encoding", "br")
	a := accepted(t, res, "reports")
	j := f.fetch(t, "reports", 1)[0]
	if j.ID != a.ID {
		t.Fatalf("job %s, want %s", j.ID, a.ID)
	}
	var got struct{ XFF, Fwd, AE string }
	got.XFF, got.Fwd, got.AE = j.Header.Get("X-Forwarded-For"), j.Header.Get("Forwarded"), j.Header.Get("Accept-Encoding")
	if got.XFF != "192.0.2.10" || !strings.Contains(got.Fwd, "for=192.0.2.10") || got.AE != "br" {
		b, _ := json.Marshal(j.Header)
		t.Fatalf("deferred job headers %s: %+v", b, got)
	}
}

// FuzzRepeatedKeyPart: a key header sent twice is refused when the values differ, and keys as
// the one value when they are equal; never a fresh key of its own.
func FuzzRepeatedKeyPart(f *testing.F) {
	f.Add("k1", "fresh")
	f.Add("same", "same")
	f.Add("", "x")
	r, err := compileRule(&config.Config{}, config.Rule{
		Name: "r", Algorithm: "fixed_window", Limit: 1, Period: 1e9,
		Key: []config.KeyPart{{Kind: config.KeyHeader, Name: "X-Key"}, {Kind: config.KeyQuery, Name: "t"}},
	}, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		key := func(h []string, rawQuery string) (string, string) {
			req := &http.Request{Header: http.Header{"X-Key": h}, URL: &url.URL{Path: "/", RawQuery: rawQuery}, RemoteAddr: "192.0.2.1:1"}
			q := &request{r: req}
			return string(r.appendKey(nil, q)), q.conflict
		}
		k2, conflict := key([]string{a, b}, "")
		k1, _ := key([]string{a}, "")
		switch {
		case a != b && conflict == "":
			t.Fatalf("header values %q and %q: no conflict", a, b)
		case a == b && (conflict != "" || k2 != k1):
			t.Fatalf("header %q twice: conflict %q, key %q, want the key %q of one", a, conflict, k2, k1)
		}
		q := "t=" + url.QueryEscape(a) + "&t=" + url.QueryEscape(b)
		if _, conflict := key(nil, q); (a != b) != (conflict != "") {
			t.Fatalf("query t=%q&t=%q: conflict %q", a, b, conflict)
		}
	})
}

// FuzzCanonicalMethod: the canonical method is the method in upper case, and canonical
// methods are left as they are.
func FuzzCanonicalMethod(f *testing.F) {
	for _, m := range []string{"GET", "post", "Patch", "M-SEARCH", "ß"} {
		f.Add(m)
	}
	f.Fuzz(func(t *testing.T, m string) {
		c := canonicalMethod(m)
		if c != strings.ToUpper(m) && strings.ContainsAny(m, "abcdefghijklmnopqrstuvwxyz") {
			t.Fatalf("canonicalMethod(%q) = %q", m, c)
		}
		if canonicalMethod(c) != c {
			t.Fatalf("canonicalMethod(%q) = %q is not canonical", m, c)
		}
		if strings.ContainsAny(c, "abcdefghijklmnopqrstuvwxyz") {
			t.Fatalf("canonicalMethod(%q) = %q has lower case", m, c)
		}
	})
}

// TestKeyFloodOverflowCounted: a flood of one-off keys past the in-memory limiter's bound is
// decided on the rule's overflow limit — limited, never unlimited — and counted.
func TestKeyFloodOverflowCounted(t *testing.T) {
	mem := limit.NewMemory(limit.MemoryConfig{MaxKeys: 64, Shards: 1})
	f := newFixture(t, `
rules:
  - { name: login, match: { path: /login }, key: [ip], algorithm: fixed_window, limit: 1, period: 1h }
  - { name: api, match: { path: /api/* }, key: [header:X-API-Key], algorithm: fixed_window, limit: 1, period: 1h }
`, Options{Limiter: mem})
	if res := f.do("GET", "/login", nil); res.StatusCode != 200 {
		t.Fatalf("first login: %d", res.StatusCode)
	}
	allowed := 0
	for i := range 2000 {
		if res := f.do("GET", "/api/x", nil, "X-API-Key", "k"+strconv.Itoa(i)); res.StatusCode == 200 {
			allowed++
		}
	}
	if res := f.do("GET", "/login", nil); res.StatusCode != 429 {
		t.Fatalf("the exhausted login key after a flood of API keys: %d, want 429", res.StatusCode)
	}
	if allowed > 64+1 {
		t.Errorf("%d of 2000 one-off keys allowed with room for 64 keys: the overflow was not limited", allowed)
	}
	if got := metric(t, f.reg, "sluice_limiter_overflow_total"); got < 2000-64 {
		t.Errorf("sluice_limiter_overflow_total = %v, want at least %d", got, 2000-64)
	}
}

// TestTenantIDKeyedWithSecret: the ingress's tenant of a request is the queue layer's
// TenantID of its key parts' values (keyed with the id secret), not their unsalted SHA-256;
// and a job recorded before the upgrade under the unsalted id is still read by its own tenant
// alone.
func TestTenantIDKeyedWithSecret(t *testing.T) {
	f := newQueueFixture(t, tenantYAML)
	a := accepted(t, f.do("POST", "/v1/queues/shared/jobs", strings.NewReader("x"), "X-API-Key", "key-A"), "shared")
	st, err := f.qs.Status(f.ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if want := f.qs.TenantID([]byte("key-A")); st.Tenant != want || st.Tenant == legacyTenantID([]byte("key-A")) {
		t.Fatalf("tenant of key-A's job = %q, want the keyed id %q", st.Tenant, want)
	}
	old, err := f.qs.Publish(f.ctx, &queue.Job{Queue: "shared", Direct: true, Body: []byte("y"), Tenant: legacyTenantID([]byte("key-A"))})
	if err != nil {
		t.Fatal(err)
	}
	for apiKey, want := range map[string]int{"key-A": 200, "key-B": 404} {
		if res := f.do("GET", JobPath(old.ID), nil, "X-API-Key", apiKey); res.StatusCode != want {
			t.Errorf("GET a job recorded under the unsalted id as %s: %d, want %d", apiKey, res.StatusCode, want)
		}
	}
}
