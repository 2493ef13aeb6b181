package ingress

import (
	"bufio"
	"encoding/json"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/config"
)

// trickyStrings are strings whose JSON escaping has cases: quotes and backslashes, control
// characters (with and without short escapes), DEL, HTML-special characters, U+2028 and
// U+2029, multi-byte UTF-8, invalid UTF-8 (a stray continuation byte, a truncated sequence,
// an encoded surrogate, an overlong form), and U+FFFD itself.
var trickyStrings = []string{
	"", "orders-per-key", `say "hi"`, `back\slash`, "tab\tnew\nline\rcr\bbs\fff",
	"\x00\x01\x1f\x7f", "<script>&amp;</script>", "line\u2028para\u2029end", "héllo wörld ✓ 日本 🚀",
	"bad \x80 byte", "truncated \xe2\x82", "surrogate \xed\xa0\x80", "overlong \xc0\xaf", "\ufffd",
	"ends with \xf0",
}

// TestProblemJSON checks that Problem.appendJSON writes exactly the bytes encoding/json's
// Marshal writes, for every field combination and tricky strings.
func TestProblemJSON(t *testing.T) {
	var problems []*Problem
	for _, s := range trickyStrings {
		problems = append(problems,
			&Problem{Type: s, Title: s, Status: 429, Detail: s, ViolatedPolicies: []string{s, "b"}, RetryAfter: 7},
			&Problem{Type: "about:blank", Title: s, Status: 400},
		)
	}
	problems = append(problems,
		&Problem{},
		&Problem{ViolatedPolicies: []string{}}, // empty is omitted, as nil is
		&Problem{Status: -1, RetryAfter: -5},   // negative numbers are written
		&Problem{Status: 503, RetryAfter: 1 << 62},
	)
	for _, p := range problems {
		want, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.appendJSON(nil); string(got) != string(want) {
			t.Errorf("appendJSON(%+v)\n got %s\nwant %s", p, got, want)
		}
	}
}

// TestQuotaExceededBody checks that the body of a 429, which the gate assembles from parts
// compiled per rule (one rule violated) or writes field by field (several), is byte for byte
// the JSON encoding/json makes of the Problem, for rule names that need escaping both as a
// Go string (in the detail) and as JSON, and for short and long waits.
func TestQuotaExceededBody(t *testing.T) {
	// The parts, for any name (invalid UTF-8 included).
	for _, name := range trickyStrings {
		head, mid := quotaBody(name)
		for _, secs := range []int64{1, 59, 1200, 1 << 40} {
			got := head + strconv.FormatInt(secs, 10) + mid + strconv.FormatInt(secs, 10) + "}"
			want, _ := json.Marshal(&Problem{Type: QuotaExceededType, Title: quotaTitle, Status: http.StatusTooManyRequests,
				Detail: quotaDetail([]string{name}, secs), ViolatedPolicies: []string{name}, RetryAfter: secs})
			if got != string(want) {
				t.Errorf("%q, %d s:\n got %s\nwant %s", name, secs, got, want)
			}
		}
	}
	// Whole answers, for names a rule can have (metric labels must be valid UTF-8).
	for _, name := range trickyStrings[1:] {
		if !utf8.ValidString(name) {
			continue
		}
		for _, period := range []time.Duration{time.Second, time.Hour, 1000 * time.Hour} {
			cfg := parseConfig(t, "http://127.0.0.1:1", "rules: []\n")
			cfg.Rules = []config.Rule{
				{Name: name, Algorithm: "fixed_window", Limit: 1, Period: period},
				{Name: name + "/2", Match: config.Match{Path: "/both"}, Algorithm: "fixed_window", Limit: 1, Period: period},
			}
			c := &clock{t: epoch}
			s, err := New(cfg, Options{Registerer: prometheus.NewRegistry(), Now: c.Now})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			check := func(target string, violated ...string) {
				t.Helper()
				serve(s.Handler(), httptestRequest("GET", target, "192.0.2.1:1"))
				res := serve(s.Handler(), httptestRequest("GET", target, "192.0.2.1:1"))
				body, _ := io.ReadAll(res.Body)
				if res.StatusCode != http.StatusTooManyRequests {
					t.Fatalf("%q %s: status %d, body %s", name, target, res.StatusCode, body)
				}
				secs, err := strconv.ParseInt(res.Header.Get("Retry-After"), 10, 64)
				if err != nil || secs < 1 || res.Header.Get("X-RateLimit-Retry-After") != res.Header.Get("Retry-After") {
					t.Fatalf("%q: Retry-After %q, X-RateLimit-Retry-After %q", name, res.Header.Get("Retry-After"), res.Header.Get("X-RateLimit-Retry-After"))
				}
				want, _ := json.Marshal(&Problem{
					Type:             QuotaExceededType,
					Title:            "Request cannot be satisfied as assigned quota has been exceeded",
					Status:           http.StatusTooManyRequests,
					Detail:           quotaDetail(violated, secs),
					ViolatedPolicies: violated,
					RetryAfter:       secs,
				})
				if string(body) != string(want) {
					t.Errorf("%q %s: body\n got %s\nwant %s", name, target, body, want)
				}
				// Content-Length is net/http's to write (TestQuotaExceededOnTheWire); a 429 is
				// never stored by a cache without being told it may be, so no Cache-Control.
				if res.Header.Get("Content-Type") != ProblemContentType || res.Header["Cache-Control"] != nil {
					t.Errorf("headers %v", res.Header)
				}
			}
			check("/one", name)
			c.Advance(2 * period) // both windows over
			check("/both", name, name+"/2")
		}
	}
}

// TestItoa checks the small-number table and the fallback around its edges.
func TestItoa(t *testing.T) {
	for _, n := range []int64{0, 1, 9, 10, 599, 1023, 1024, 1025, 1 << 40, -1, -1024} {
		if got := itoa(n); got != strconv.FormatInt(n, 10) {
			t.Errorf("itoa(%d) = %q", n, got)
		}
	}
}

// TestQuotaExceededOnTheWire checks a 429 as a client reads it from a real server: every
// header the contract names, a Content-Length that net/http wrote for a short body and the
// gate for a long one (no chunking either way), and no other header but Date.
func TestQuotaExceededOnTheWire(t *testing.T) {
	long := strings.Repeat("a-rule-with-a-name-long-enough-to-fill-a-body-", 2) // 92 bytes
	for _, tc := range []struct {
		name  string
		rules int
	}{{"one rule", 1}, {"a body over net/http's buffer", 30}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := parseConfig(t, "http://127.0.0.1:1", "rules: []\n")
			for i := range tc.rules {
				cfg.Rules = append(cfg.Rules, config.Rule{Name: long + strconv.Itoa(i), Algorithm: "fixed_window", Limit: 1, Period: time.Hour})
			}
			s, err := New(cfg, Options{Registerer: prometheus.NewRegistry()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			ts := httptest.NewServer(s.Handler())
			t.Cleanup(ts.Close)
			conn, err := net.Dial("tcp", ts.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			br := bufio.NewReader(conn)
			var res *http.Response
			for range 2 { // the first spends the limit of 1, on one kept-alive connection
				if _, err := io.WriteString(conn, "GET /x HTTP/1.1\r\nHost: sluice.test\r\n\r\n"); err != nil {
					t.Fatal(err)
				}
				if res, err = http.ReadResponse(br, nil); err != nil {
					t.Fatal(err)
				}
				if _, err := io.Copy(io.Discard, res.Body); err != nil {
					t.Fatal(err)
				}
			}
			if res.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("status %d", res.StatusCode)
			}
			if res.TransferEncoding != nil || res.ContentLength <= 0 {
				t.Errorf("Transfer-Encoding %v, Content-Length %d", res.TransferEncoding, res.ContentLength)
			}
			if tc.rules > 1 && res.ContentLength <= heldWhole {
				t.Errorf("body of %d bytes; the case needs one over %d", res.ContentLength, heldWhole)
			}
			want := []string{"Content-Length", "Content-Type", "Date", "Ratelimit", "Ratelimit-Policy", "Retry-After",
				"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "X-Ratelimit-Retry-After"}
			got := slices.Sorted(maps.Keys(res.Header))
			if !slices.Equal(got, want) {
				t.Errorf("headers %v, want %v", got, want)
			}
		})
	}
}

// TestProblemCacheControl checks that a problem says no-store exactly where a cache could
// otherwise store it, and replaces an upstream's Cache-Control either way.
func TestProblemCacheControl(t *testing.T) {
	for status, want := range map[int]string{404: "no-store", 405: "no-store", 410: "no-store", 414: "no-store", 501: "no-store",
		400: "", 413: "", 429: "", 502: "", 503: "", 504: ""} {
		w := httptest.NewRecorder()
		w.Header().Set("Cache-Control", "max-age=3600") // an upstream's, under an answer replaced
		writeProblem(w, &Problem{Type: "about:blank", Title: http.StatusText(status), Status: status})
		if got := w.Header().Get("Cache-Control"); got != want {
			t.Errorf("%d: Cache-Control %q, want %q", status, got, want)
		}
		if got := w.Header().Get("Content-Length"); got != strconv.Itoa(w.Body.Len()) {
			t.Errorf("%d: Content-Length %q for %d bytes", status, got, w.Body.Len())
		}
	}
}
