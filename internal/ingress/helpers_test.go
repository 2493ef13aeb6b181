package ingress

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
)

// --- a structured-field list parser (RFC 9651 4.2.1), for reading RateLimit headers back ---

type sfItem struct {
	value  any // string (sf-string or token), int64, bool
	params map[string]any
}

// parseSFList parses a List of Items with parameters. It fails on anything it does not
// understand, as the RFC demands.
func parseSFList(s string) ([]sfItem, error) {
	p := &sfp{s: strings.TrimSpace(s)}
	var out []sfItem
	for {
		it, err := p.item()
		if err != nil {
			return nil, err
		}
		out = append(out, it)
		p.ows()
		if p.done() {
			return out, nil
		}
		if !p.eat(',') {
			return nil, fmt.Errorf("sf: want ',' at %d in %q", p.i, p.s)
		}
		p.ows()
		if p.done() {
			return nil, fmt.Errorf("sf: trailing comma in %q", p.s)
		}
	}
}

type sfp struct {
	s string
	i int
}

func (p *sfp) done() bool { return p.i >= len(p.s) }
func (p *sfp) eat(c byte) bool {
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}
func (p *sfp) ows() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *sfp) item() (sfItem, error) {
	v, err := p.bare()
	if err != nil {
		return sfItem{}, err
	}
	it := sfItem{value: v, params: map[string]any{}}
	for p.eat(';') {
		for p.i < len(p.s) && p.s[p.i] == ' ' {
			p.i++
		}
		start := p.i
		for p.i < len(p.s) && (p.s[p.i] >= 'a' && p.s[p.i] <= 'z' || p.s[p.i] >= '0' && p.s[p.i] <= '9' || strings.IndexByte("_-.*", p.s[p.i]) >= 0) {
			p.i++
		}
		key := p.s[start:p.i]
		if key == "" {
			return sfItem{}, fmt.Errorf("sf: empty key in %q", p.s)
		}
		var val any = true
		if p.eat('=') {
			if val, err = p.bare(); err != nil {
				return sfItem{}, err
			}
		}
		it.params[key] = val
	}
	return it, nil
}

func (p *sfp) bare() (any, error) {
	if p.done() {
		return nil, fmt.Errorf("sf: unexpected end of %q", p.s)
	}
	c := p.s[p.i]
	switch {
	case c == '"':
		p.i++
		var b strings.Builder
		for !p.done() {
			c := p.s[p.i]
			p.i++
			switch {
			case c == '\\':
				if p.done() || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
					return nil, fmt.Errorf("sf: bad escape in %q", p.s)
				}
				b.WriteByte(p.s[p.i])
				p.i++
			case c == '"':
				return b.String(), nil
			case c < 0x20 || c > 0x7e:
				return nil, fmt.Errorf("sf: bad string byte in %q", p.s)
			default:
				b.WriteByte(c)
			}
		}
		return nil, fmt.Errorf("sf: unterminated string in %q", p.s)
	case c == '-' || c >= '0' && c <= '9':
		start := p.i
		p.i++
		for !p.done() && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
			p.i++
		}
		if p.i-start > 15 {
			return nil, fmt.Errorf("sf: integer too long in %q", p.s)
		}
		return strconv.ParseInt(p.s[start:p.i], 10, 64)
	case c == '?':
		p.i++
		if p.eat('1') {
			return true, nil
		}
		if p.eat('0') {
			return false, nil
		}
		return nil, fmt.Errorf("sf: bad boolean in %q", p.s)
	case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '*':
		start := p.i
		for !p.done() && (isTokenChar(p.s[p.i]) || p.s[p.i] == ':' || p.s[p.i] == '/') {
			p.i++
		}
		return p.s[start:p.i], nil
	}
	return nil, fmt.Errorf("sf: unexpected %q at %d in %q", c, p.i, p.s)
}

// policy is one RateLimit-Policy item and the matching RateLimit item, read back.
type policy struct {
	name       string
	q, w, r, t int64
}

// readPolicy parses the RateLimit-Policy and RateLimit headers of h, which must hold one
// policy each, of the same name.
func readPolicy(t *testing.T, h http.Header) policy {
	t.Helper()
	pol, err := parseSFList(h.Get("RateLimit-Policy"))
	if err != nil || len(pol) != 1 {
		t.Fatalf("RateLimit-Policy %q: %v, %d items", h.Get("RateLimit-Policy"), err, len(pol))
	}
	rl, err := parseSFList(h.Get("RateLimit"))
	if err != nil || len(rl) != 1 {
		t.Fatalf("RateLimit %q: %v, %d items", h.Get("RateLimit"), err, len(rl))
	}
	name, ok1 := pol[0].value.(string)
	name2, ok2 := rl[0].value.(string)
	if !ok1 || !ok2 || name != name2 {
		t.Fatalf("policy names %v and %v", pol[0].value, rl[0].value)
	}
	p := policy{name: name}
	for _, f := range []struct {
		dst  *int64
		it   sfItem
		name string
	}{{&p.q, pol[0], "q"}, {&p.w, pol[0], "w"}, {&p.r, rl[0], "r"}, {&p.t, rl[0], "t"}} {
		v, ok := f.it.params[f.name].(int64)
		if !ok {
			t.Fatalf("parameter %s missing or not an integer in %v", f.name, f.it.params)
		}
		*f.dst = v
	}
	// The X- headers say the same.
	if got := h.Get("X-RateLimit-Limit"); got != strconv.FormatInt(p.q, 10) {
		t.Errorf("X-RateLimit-Limit = %q, RateLimit-Policy q = %d", got, p.q)
	}
	if got := h.Get("X-RateLimit-Remaining"); got != strconv.FormatInt(p.r, 10) {
		t.Errorf("X-RateLimit-Remaining = %q, RateLimit r = %d", got, p.r)
	}
	if got := h.Get("X-RateLimit-Reset"); got != strconv.FormatInt(p.t, 10) {
		t.Errorf("X-RateLimit-Reset = %q, RateLimit t = %d", got, p.t)
	}
	return p
}

// problemBody is a problem+json body, read back.
type problemBody struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail"`
	ViolatedPolicies []string `json:"violated-policies"`
	RetryAfter       int64    `json:"retry_after"`
}

// readProblem checks that res is a problem+json answer with status code and returns it.
func readProblem(t *testing.T, res *http.Response, code int) problemBody {
	t.Helper()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != code {
		t.Fatalf("status %d, want %d; body %s", res.StatusCode, code, body)
	}
	if ct := res.Header.Get("Content-Type"); ct != ProblemContentType {
		t.Fatalf("Content-Type %q, want %q; body %s", ct, ProblemContentType, body)
	}
	var p problemBody
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("problem body %s: %v", body, err)
	}
	if p.Status != code || p.Title == "" || p.Type == "" {
		t.Fatalf("problem %+v: want status %d, a title and a type", p, code)
	}
	return p
}

// --- servers ---

// echoed is what the test upstream answers: what it received.
type echoed struct {
	Method string      `json:"method"`
	Path   string      `json:"path"`
	Query  string      `json:"query"`
	Host   string      `json:"host"`
	Header http.Header `json:"header"`
	Body   string      `json:"body"`
}

// upstreamServer starts an upstream that answers 200 with an echoed JSON body.
func upstreamServer(t testing.TB) *httptest.Server {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Upstream", "yes")
		json.NewEncoder(w).Encode(echoed{Method: r.Method, Path: r.URL.EscapedPath(), Query: r.URL.RawQuery,
			Host: r.Host, Header: r.Header, Body: string(body)})
	}))
	t.Cleanup(up.Close)
	return up
}

// parseConfig parses yaml as a config file, with upstream set to upstreamURL.
func parseConfig(t testing.TB, upstreamURL, yaml string) *config.Config {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte("upstream: "+upstreamURL+"\n"+yaml), nil)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

// fixture is a Server under test with its upstream and registry.
type fixture struct {
	t        testing.TB
	srv      *Server
	up       *httptest.Server
	reg      *prometheus.Registry
	handler  http.Handler
	clock    *clock
	peerAddr string
}

// clock is a settable clock, safe for concurrent use.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// epoch is the fixed clock's start: 10 minutes into an hour, so hour-long fixed windows have
// 50 minutes left.
var epoch = time.Date(2030, 1, 1, 12, 10, 0, 0, time.UTC)

// newFixture starts a Server for yaml (upstream added) with opts; a nil opts.Now gets a
// fixed clock the test can advance.
func newFixture(t testing.TB, yaml string, opts Options) *fixture {
	t.Helper()
	f := &fixture{t: t, up: upstreamServer(t), reg: prometheus.NewRegistry(), peerAddr: "192.0.2.10:40000"}
	if opts.Now == nil {
		f.clock = &clock{t: epoch}
		opts.Now = f.clock.Now
	}
	opts.Registerer = f.reg
	srv, err := New(parseConfig(t, f.up.URL, yaml), opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(srv.Close)
	f.srv, f.handler = srv, srv.Handler()
	return f
}

// do serves one request in-process and returns the response.
func (f *fixture) do(method, target string, body io.Reader, hdr ...string) *http.Response {
	f.t.Helper()
	r := httptest.NewRequest(method, target, body)
	r.RemoteAddr = f.peerAddr
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	res, err := api.Handler("job", f.handler).RoundTrip(r)
	if err != nil { // off the job API's OpenAPI document; do may run on a goroutine of the test's
		f.t.Error(err)
		return &http.Response{Status: "openapi", Header: http.Header{}, Body: http.NoBody}
	}
	return res
}

// readEchoed decodes the upstream's echo from a 200 response.
func readEchoed(t testing.TB, res *http.Response) echoed {
	t.Helper()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200 from the upstream; body %s", res.StatusCode, body)
	}
	var e echoed
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("upstream body %s: %v", body, err)
	}
	return e
}

// httptestRequest returns a request from peer.
func httptestRequest(method, target, peer string) *http.Request {
	r := httptest.NewRequest(method, target, nil)
	r.RemoteAddr = peer
	return r
}

// serve serves r in-process.
func serve(h http.Handler, r *http.Request) *http.Response {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Result()
}

// metric reads a metric of reg; see testenv.Metric.
func metric(t testing.TB, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	return testenv.Metric(t, reg, name, labels...)
}

// storeClient returns a go-redis client for rs set up as connect.Redis sets up the processes'
// clients where it matters to the Gate: every command is bounded by its context
// (ContextTimeoutEnabled), which is what bounds a store call by store_timeout. Unlike
// connect.Redis's, it does not retry, as testenv's clients do not. The test's cleanup closes it.
func storeClient(t testing.TB, rs *testenv.RedisServer) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: rs.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}

// testGate compiles cfg into a gate with opts, its metrics going to opts.Registerer.
func testGate(t testing.TB, cfg *config.Config, opts Options) *gate {
	t.Helper()
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		t.Fatal(err)
	}
	g, err := newGate(cfg, opts, m)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// gateMiddleware runs g in front of an echo app's handlers, as the Server runs it in front of
// its proxy: the decision path alone. Install it with Pre, so that the rules see the cleaned
// path before routing.
func gateMiddleware(g *gate) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			var h held
			ok, hdrs, err := g.check(c, &h)
			if !ok {
				return err
			}
			defer g.release(&h)
			if hdrs != nil {
				hdrs.install(c.Response())
			}
			return next(c)
		}
	}
}
