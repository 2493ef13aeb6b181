package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/openapi/openapitest"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// api validates the tests' requests to admin servers, and the answers, against the admin
// OpenAPI document: those get sends in-process, and those sent to a listener of serve.
var api *openapitest.Validator

func TestMain(m *testing.M) {
	api = openapitest.Install()
	code := api.Finish(m.Run())
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// get serves GET path with h in-process, validated against the admin OpenAPI document.
func get(t *testing.T, h http.Handler, path string) (*http.Response, []byte) {
	t.Helper()
	req := httptest.NewRequest("GET", "http://127.0.0.1:9090"+path, nil)
	req.RemoteAddr = "127.0.0.1:1234" // a loopback peer: without an admin token, one that sees addresses
	res, err := api.Handler("admin", h).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	return res, body
}

// watch runs s's checks in the background, every 20ms, until the test ends.
func watch(t *testing.T, s *Server) {
	t.Helper()
	s.checkEvery = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Watch(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// TestReadyz checks /healthz, and /readyz against a real redis-server and NATS server: ready
// while both answer, 503 naming the one that does not once it is down.
func TestReadyz(t *testing.T) {
	rs := testenv.Redis(t)
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns.URL)
	s := New("127.0.0.1:0", prometheus.NewRegistry(), RedisCheck(rs.NewClient()), NATSCheck(nc))
	s.checkTimeout = 500 * time.Millisecond
	watch(t, s)

	if res, body := get(t, s.Handler(), "/healthz"); res.StatusCode != 200 || !strings.Contains(string(body), `"ok"`) {
		t.Fatalf("healthz: %d %s", res.StatusCode, body)
	}
	var (
		res  *http.Response
		body []byte
		r    readiness
	)
	testenv.WaitFor(t, 5*time.Second, "readyz with both up", func() bool {
		res, body = get(t, s.Handler(), "/readyz")
		r = readiness{}
		return json.Unmarshal(body, &r) == nil && res.StatusCode == 200 && r.Status == "ok" && r.Checks["redis"] == "ok" && r.Checks["nats"] == "ok"
	})

	rs.Stop()
	testenv.WaitFor(t, 5*time.Second, "readyz with redis down", func() bool {
		res, body = get(t, s.Handler(), "/readyz")
		r = readiness{}
		return json.Unmarshal(body, &r) == nil && res.StatusCode == 503
	})
	if r.Status != "unavailable" || r.Checks["redis"] == "ok" || r.Checks["nats"] != "ok" {
		t.Fatalf("readyz with redis down: %d %s", res.StatusCode, body)
	}
	// /healthz does not depend on the checks.
	if res, _ := get(t, s.Handler(), "/healthz"); res.StatusCode != 200 {
		t.Fatalf("healthz with redis down: %d", res.StatusCode)
	}
	rs.Start()
	testenv.WaitFor(t, 5*time.Second, "readyz after redis restarts", func() bool {
		res, _ := get(t, s.Handler(), "/readyz")
		return res.StatusCode == 200
	})
}

// TestReadyzAnswersWhileACheckHangs: /readyz answers from the checks' latest results, never
// waiting on a check: before its first answer it says "not checked yet", and a check that has
// not answered for checkStall counts as failed, while every answer comes within milliseconds:
// 50 ms, not counting the time the process stalled meanwhile (testenv.Lag: on a loaded
// machine, two busy loops and -race, an answer took up to 165 ms, and 1 run in 20 failed).
// A check that ends in error (its timeout) is named with its error; a Local check is run by
// /readyz itself, so its change shows at once.
func TestReadyzAnswersWhileACheckHangs(t *testing.T) {
	var hang, local atomic.Bool
	release := make(chan struct{})
	s := New("127.0.0.1:0", nil,
		Check{Name: "slow", Func: func(ctx context.Context) error {
			if !hang.Load() {
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-release:
				return errors.New("gave up waiting")
			}
		}},
		Check{Name: "local", Local: true, Func: func(context.Context) error {
			if local.Load() {
				return errors.New("local state says no")
			}
			return nil
		}})
	s.checkStall = 100 * time.Millisecond
	lag := testenv.NewLag(t)
	var slowest, slowestLost time.Duration // the slowest answer, less the process's stalls
	readyz := func() (int, string, time.Duration) {
		start := time.Now()
		res, body := get(t, s.Handler(), "/readyz")
		took := time.Since(start)
		if took > 50*time.Millisecond { // only then: Lost waits for the probe's next wake
			lost, _ := lag.Lost(start, start.Add(took))
			if took-lost > slowest {
				slowest, slowestLost = took-lost, lost
			}
		}
		return res.StatusCode, string(body), took
	}
	if code, body, _ := readyz(); code != 503 || !strings.Contains(body, "not checked yet") {
		t.Fatalf("readyz before the first check: %d %s", code, body)
	}
	watch(t, s)
	testenv.WaitFor(t, 5*time.Second, "readyz ok", func() bool { code, _, _ := readyz(); return code == 200 })
	local.Store(true)
	if code, body, _ := readyz(); code != 503 || !strings.Contains(body, "local state says no") {
		t.Fatalf("readyz once the local check fails: %d %s", code, body)
	}
	local.Store(false)

	hang.Store(true) // the next run hangs until released
	slowest = 0      // from here on
	testenv.WaitFor(t, 5*time.Second, "readyz to say the check does not answer", func() bool {
		code, body, _ := readyz()
		return code == 503 && strings.Contains(body, "no answer for")
	})
	close(release) // the run ends in error, and so do the next ones
	testenv.WaitFor(t, 5*time.Second, "readyz to name the check's error", func() bool {
		code, body, _ := readyz()
		return code == 503 && strings.Contains(body, "gave up waiting")
	})
	if slowest > 50*time.Millisecond {
		t.Errorf("the slowest /readyz took %v while a check hung, less %v the process stalled; want it answered at once",
			slowest+slowestLost, slowestLost)
	}
}

// TestMetricsAndServe serves on a real listener and reads /metrics, which holds the
// registry's metrics and the reload-error counter.
func TestMetricsAndServe(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_test_total", Help: "x"})
	reg.MustRegister(c)
	c.Add(3)
	s := New("127.0.0.1:0", reg)
	s.ReloadFailed()
	New("127.0.0.1:0", reg).ReloadFailed() // a second server on the registry shares the counter

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	api.Serve(t, "admin", ln.Addr().String())
	res, err := http.Get("http://" + ln.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{"sluice_test_total 3", "sluice_config_reload_errors_total 2"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
	http.DefaultClient.CloseIdleConnections()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve returned %v after ctx was cancelled, want nil", err)
	}
}

// fakeInfo is not a fake of NATS: it stands for the queue layer in the tests that check only
// the HTTP shape; TestQueuesNATS runs the endpoints against real JetStream.
type infoFunc func(ctx context.Context, name string) (queue.Info, error)

func (f infoFunc) Info(ctx context.Context, name string) (queue.Info, error) { return f(ctx, name) }

func queuesConfig(t *testing.T) *config.Config {
	t.Helper()
	cfg, err := config.Parse("t.yaml", []byte(`
queues:
  - { name: orders, rate: 50/s, burst: 5, max_depth: 1000 }
  - { name: reports, rate: 5/2s, cost_rate: 20000/m, cost_burst: 500 }
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestQueuesShape(t *testing.T) {
	cfg := queuesConfig(t)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s := New("127.0.0.1:0", nil)
	(&Queues{
		Info: infoFunc(func(ctx context.Context, name string) (queue.Info, error) {
			if name == "reports" {
				return queue.Info{Name: name, Depth: 7, Pending: 5, InFlight: 2, Consumers: 1, DeadLetters: 3}, nil
			}
			return queue.Info{Name: name}, nil
		}),
		Config: func() *config.Config { return cfg },
		PausedUntil: func(ctx context.Context, q string) (time.Time, bool, error) {
			return now.Add(30 * time.Second), q == "reports", nil
		},
		Now: func() time.Time { return now },
	}).Mount(s)

	res, body := get(t, s.Handler(), "/v1/queues")
	var list struct{ Queues []QueueStatus }
	if err := json.Unmarshal(body, &list); err != nil || res.StatusCode != 200 || len(list.Queues) != 2 {
		t.Fatalf("list: %d %s", res.StatusCode, body)
	}
	o, r := list.Queues[0], list.Queues[1]
	if o.Name != "orders" || o.Rate != "50/s" || o.RatePerSecond != 50 || o.Burst != 5 || o.MaxDepth != 1000 || o.PausedUntil != nil || o.CostRate != "" {
		t.Errorf("orders: %+v", o)
	}
	if r.Rate != "5/2s" || r.RatePerSecond != 2.5 || r.Depth != 7 || r.Pending != 5 || r.InFlight != 2 || r.DeadLetters != 3 || r.Consumers != 1 ||
		r.PausedUntil == nil || !r.PausedUntil.Equal(now.Add(30*time.Second)) ||
		r.CostRate != "20000/m" || r.CostPerSecond < 333.3 || r.CostPerSecond > 333.4 || r.CostBurst != 500 {
		t.Errorf("reports: %+v", r)
	}
	if res, body := get(t, s.Handler(), "/v1/queues/reports"); res.StatusCode != 200 || !strings.Contains(string(body), `"depth":7`) {
		t.Errorf("one: %d %s", res.StatusCode, body)
	}
	res, body = get(t, s.Handler(), "/v1/queues/nope")
	if res.StatusCode != 404 || res.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(body), `nope`) {
		t.Errorf("unknown: %d %q %s", res.StatusCode, res.Header.Get("Content-Type"), body)
	}
}

func TestQueuesStoreDown(t *testing.T) {
	cfg := queuesConfig(t)
	s := New("127.0.0.1:0", nil)
	(&Queues{
		Info: infoFunc(func(ctx context.Context, name string) (queue.Info, error) {
			return queue.Info{}, errors.New("nats: no responders")
		}),
		Config: func() *config.Config { return cfg },
	}).Mount(s)
	for _, p := range []string{"/v1/queues", "/v1/queues/orders"} {
		if res, _ := get(t, s.Handler(), p); res.StatusCode != 503 || res.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s with the queue layer down: %d %q", p, res.StatusCode, res.Header.Get("Content-Type"))
		}
	}
}

// TestQueuesNATS serves the queue endpoints from real JetStream: the depth and dead letters
// are those of the queue's streams.
func TestQueuesNATS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(testenv.Connect(t, testenv.NATS(t).URL))
	if err != nil {
		t.Fatal(err)
	}
	qs, err := queue.New(ctx, js, queue.Options{Prefix: testenv.Name(t)})
	if err != nil {
		t.Fatal(err)
	}
	cfg := queuesConfig(t)
	if err := qs.Provision(ctx, []queue.Spec{{Name: "orders", MaxDepth: 1000}}); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if _, err := qs.Publish(ctx, &queue.Job{Queue: "orders", Direct: true, Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 { // scheduled an hour ahead: counted apart from the depth
		if _, err := qs.Publish(ctx, &queue.Job{Queue: "orders", Direct: true, NotBefore: time.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	s := New("127.0.0.1:0", nil)
	(&Queues{Info: qs, Config: func() *config.Config { return cfg }}).Mount(s)

	// The consumer's pending count follows the stream's a moment later, on the server's time.
	var (
		res  *http.Response
		body []byte
		st   QueueStatus
	)
	testenv.WaitFor(t, 5*time.Second, "the consumer counts the 4 jobs pending", func() bool {
		res, body = get(t, s.Handler(), "/v1/queues/orders")
		st = QueueStatus{}
		return json.Unmarshal(body, &st) == nil && st.Pending == 4
	})
	if res.StatusCode != 200 || st.Depth != 4 || st.Scheduled != 2 || st.Pending != 4 || st.Rate != "50/s" || st.PausedUntil != nil {
		t.Fatalf("orders: %d %s", res.StatusCode, body)
	}
	// "reports" is configured but was not provisioned.
	if res, body := get(t, s.Handler(), "/v1/queues/reports"); res.StatusCode != 404 {
		t.Fatalf("unprovisioned queue: %d %s", res.StatusCode, body)
	}
}

func TestExposed(t *testing.T) {
	for _, tc := range []struct {
		addr, token string
		want        bool
	}{
		{"127.0.0.1:9090", "", false}, {"[::1]:9090", "", false}, {"localhost:9090", "", false},
		{"0.0.0.0:9090", "", true}, {":9090", "", true}, {"10.0.0.5:9090", "", true},
		{"0.0.0.0:9090", "s3cret", false},
	} {
		if got := Exposed(tc.addr, tc.token); got != tc.want {
			t.Errorf("Exposed(%q, %q) = %v, want %v", tc.addr, tc.token, got, tc.want)
		}
	}
}

// TestTenantByValue: GET /v1/queues/{q}/tenants/{value} finds a fair queue's tenant by its
// value through TenantID (keyed with the id secret), labels it when tenant_settings do (never
// showing its value), and finds it by its id too; a tenant id derived under another secret is another tenant, with nothing waiting.
func TestTenantByValue(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(testenv.Connect(t, testenv.NATS(t).URL))
	if err != nil {
		t.Fatal(err)
	}
	qs, err := queue.New(ctx, js, queue.Options{Prefix: testenv.Name(t)})
	if err != nil {
		t.Fatal(err)
	}
	other, err := queue.New(ctx, js, queue.Options{Prefix: testenv.Name(t), IDSecret: []byte("another deployment's secret")})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("t.yaml", []byte("queues:\n  - { name: orders, rate: 5/s, tenant: 'header:X-Tenant', fair: true, weights: { gold-key: 3 }, tenant_settings: { gold-key: { label: gold } } }\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := qs.Provision(ctx, []queue.Spec{{Name: "orders", Fair: true}}); err != nil {
		t.Fatal(err)
	}
	gold := qs.TenantID([]byte("gold-key"))
	for range 2 {
		if _, err := qs.Publish(ctx, &queue.Job{Queue: "orders", Direct: true, Tenant: gold, Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	s := New("127.0.0.1:0", nil)
	tenantID := func(key []byte) (string, error) { return qs.TenantID(key), nil }
	(&Queues{Info: qs, Config: func() *config.Config { return cfg }, Tenant: qs.Tenant, TenantID: tenantID}).Mount(s)

	read := func(path string) TenantStatus {
		t.Helper()
		res, body := get(t, s.Handler(), path)
		var ts TenantStatus
		if res.StatusCode != 200 || json.Unmarshal(body, &ts) != nil {
			t.Fatalf("GET %s: %d %s", path, res.StatusCode, body)
		}
		return ts
	}
	for _, path := range []string{"/v1/queues/orders/tenants/gold-key", "/v1/queues/orders/tenants/" + gold} {
		if ts := read(path); ts.Tenant != gold || ts.Label != "gold" || ts.Weight != 3 || ts.Depth != 2 {
			t.Errorf("GET %s = %+v, want tenant %s labelled gold, weight 3, depth 2", path, ts, gold)
		}
	}
	elsewhere := other.TenantID([]byte("gold-key"))
	if elsewhere == gold {
		t.Fatal("two secrets derive one tenant id")
	}
	if ts := read("/v1/queues/orders/tenants/" + elsewhere); ts.Depth != 0 || ts.Label != "" {
		t.Errorf("the id under another secret = %+v, want an unnamed tenant with nothing waiting", ts)
	}
}

func TestProblemDetailWithoutPackagePrefixes(t *testing.T) {
	for in, want := range map[string]string{
		"queue: conflict: job 01ab is running":      "job 01ab is running",
		"queue: job not found: \"01ab\"":            "\"01ab\"",
		"queue: info \"orders\": backlogs: timeout": "info \"orders\": backlogs: timeout",
		"leaky: redis: redis: connection refused":   "redis: connection refused",
		"no queue named \"x\"":                      "no queue named \"x\"",
		"queues: a word that only starts like one":  "queues: a word that only starts like one",
	} {
		if got := plainDetail(in); got != want {
			t.Errorf("plainDetail(%q) = %q, want %q", in, got, want)
		}
	}
}
