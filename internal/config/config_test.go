package config

import (
	"errors"
	"go/parser"
	"go/token"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/limit"
)

// noEnv is an environment with nothing set.
func noEnv(string) string { return "" }

// mustParse parses yaml as sluice.yaml with no environment and fails the test on error.
func mustParse(t *testing.T, yaml string) *Config {
	t.Helper()
	c, err := Parse("sluice.yaml", []byte(yaml), noEnv)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

// problemLines parses yaml and returns the lines of its error; it fails the test if yaml
// is valid or the error is not an *Error.
func problemLines(t *testing.T, yaml string) []string {
	t.Helper()
	_, err := Parse("sluice.yaml", []byte(yaml), noEnv)
	if err == nil {
		t.Fatalf("Parse succeeded on\n%s", yaml)
	}
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("error %T is not an *Error: %v", err, err)
	}
	if ce.File != "sluice.yaml" || len(ce.Problems) == 0 {
		t.Fatalf("Error{File: %q, %d problems}", ce.File, len(ce.Problems))
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(ce.Problems) {
		t.Fatalf("%d lines for %d problems:\n%v", len(lines), len(ce.Problems), err)
	}
	return lines
}

func TestFullExampleLoads(t *testing.T) {
	for _, v := range []string{EnvRedisURL, EnvNATSURL, EnvListen, EnvAdminListen} {
		t.Setenv(v, "")
	}
	path := filepath.Join("testdata", "full.yaml")
	got, err := Load(path)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := &Config{
		Path:        path,
		Tracing:     &Tracing{OTLP: "https://otel.internal:4318", SampleRatio: 0.5},
		Listen:      "0.0.0.0:8080",
		AdminListen: "127.0.0.1:9091",
		Upstream:    "http://127.0.0.1:9000",
		TrustedProxies: []netip.Prefix{
			netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("10.0.0.0/8"),
			netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("192.168.1.7/32"),
		},
		DataDir:         "/var/lib/sluice",
		DemoUpstream:    "127.0.0.1:9000",
		Redis:           &Redis{URL: "redis://:secret@127.0.0.1:6379/2"},
		NATS:            &NATS{URL: "nats://10.0.0.1:4222, nats://10.0.0.2:4222", Replicas: 3, StoreBudget: 1 << 30, JetStreamDomain: "hub"},
		OnStoreError:    StoreErrorDeny,
		StoreTimeout:    75 * time.Millisecond,
		ShutdownTimeout: 30 * time.Second,
		JobRetention:    72 * time.Hour,
		MaxHeaderBytes:  32768,
		ReadTimeout:     30 * time.Second,
		ReadAheadBytes:  32 << 20,
		IPv6Prefix:      64,
		FormatSuffixes:  DefaultFormatSuffixes,
		Queues: []Queue{{
			Name: "orders", Rate: Rate{N: 50, Per: time.Second}, Burst: 5, MaxDepth: 5000,
			MaxBodyBytes: 65536, MaxBytes: 64 << 20, Target: &Target{Method: "PUT", URL: "https://orders.internal/api/orders"},
			MaxAttempts: 5, Backoff: Backoff{Initial: 500 * time.Millisecond, Max: time.Minute},
			Timeout: 3 * time.Second, DedupeWindow: time.Hour, AckWait: 5 * time.Second, MaxDelay: DefaultMaxDelay, Concurrency: 16, MaxPauseRetries: 3,
			Tenant: []KeyPart{{Kind: KeyHeader, Name: "X-Api-Key"}}, Adaptive: true, MinRate: Rate{5, time.Second},
			Fair: true, Weights: map[string]float64{"gold-key": 3, "bronze-key": 0.5}, TenantRate: Rate{20, time.Second},
			MaxInFlight: 12, TenantInFlight: 3, PauseScope: PauseTenant, pauseScopeSet: true,
			TenantMaxDepth: 1000,
			TenantSettings: map[string]TenantSettings{"gold-key": {Rate: Rate{40, time.Second}, InFlight: 6}, "bronze-key": {Weight: 0.25}},
		}, {
			Name: "reports", Rate: Rate{N: 5, Per: 2 * time.Second}, MaxDepth: DefaultMaxDepth,
			MaxBodyBytes: DefaultMaxBodyBytes, MaxBytes: 896 << 20, Target: &Target{Method: "POST", URL: "http://reports.internal/run"},
			MaxAttempts: DefaultMaxAttempts, Backoff: Backoff{Initial: time.Second, Max: 5 * time.Minute},
			Timeout: DefaultTimeout, DedupeWindow: DefaultDedupeWindow, AckWait: DefaultAckWait, MaxDelay: DefaultMaxDelay, Concurrency: DefaultConcurrency,
			MaxPauseRetries: DefaultMaxPauseRetries, MinRate: Rate{1, time.Second}, PauseScope: PauseQueue,
		}},
		Rules: []Rule{{
			Name: "orders-per-key", Match: Match{Methods: []string{"POST"}, Path: "/api/orders"},
			Key: []KeyPart{{KeyHeader, "X-Api-Key"}}, Algorithm: limit.TokenBucket, Limit: 10,
			Period: time.Second, Burst: 20, OnLimit: OnLimitEnqueue, Action: ActionLimit, Queue: "orders",
		}, {
			Name: "login", Match: Match{Methods: []string{"POST", "PUT"}, Path: "/login"},
			Key: []KeyPart{{KeyIP, ""}, {KeyPath, ""}}, Algorithm: limit.LeakyBucket, Limit: 5,
			Period: time.Minute, Burst: 2, OnLimit: OnLimitReject, Action: ActionLimit, OnStoreError: StoreErrorDeny,
		}, {
			Name: "search", Match: Match{Path: "/search/*"}, Key: []KeyPart{{KeyQuery, "tenant"}, {KeyMethod, ""}},
			Algorithm: limit.FixedWindow, Limit: 100, Period: time.Minute, OnLimit: OnLimitReject, Action: ActionLimit,
			OnStoreReset: limit.ResetConservative,
		}, {
			Name: "exports", Match: Match{Methods: []string{"GET"}, Path: "/exports/*"}, Key: []KeyPart{{KeyIP, ""}},
			Algorithm: limit.SlidingLog, Limit: 3, Period: time.Hour, OnLimit: OnLimitReject, Action: ActionLimit,
			Shadow: true,
		}, {
			Name: "global", Match: Match{Path: "/*"}, Key: []KeyPart{{KeyConst, "all"}},
			Algorithm: limit.SlidingWindow, Limit: 1000, Period: time.Second, OnLimit: OnLimitReject,
			Action: ActionLimit, OnStoreError: StoreErrorAllow,
		}, {
			Name: "webhooks", Match: Match{Path: "/hooks/*"}, Key: []KeyPart{{KeyIP, ""}},
			Algorithm: limit.GCRA, Limit: 20, Period: time.Second, Burst: 5, OnLimit: OnLimitReject, Action: ActionLimit,
		}, {
			Name: "conns-per-key", Match: Match{Path: "/*"}, Key: []KeyPart{{KeyHeader, "X-Api-Key"}},
			Algorithm: AlgorithmConcurrency, Limit: 4, Timeout: 2 * time.Minute, OnLimit: OnLimitReject, Action: ActionLimit,
		}, {
			Name: "llm-tokens", Match: Match{Methods: []string{"POST"}, Path: "/v1/messages"},
			Key: []KeyPart{{KeyHeader, "X-Api-Key"}}, OnLimit: OnLimitReject, Action: ActionLimit,
			Budgets: []Budget{{
				Name: "input", Algorithm: limit.SlidingWindow, Limit: 400000, Period: time.Minute,
				Cost: mustCost(t, "json:/n", false), CostFallback: 30000, CostFromResponse: mustCost(t, "json:/usage/input_tokens", true),
			}, {
				Name: "output", Algorithm: limit.TokenBucket, Limit: 80000, Period: time.Minute, Burst: 8000,
				Cost: mustCost(t, "json:/max_tokens", false), CostFromResponse: mustCost(t, "json:/usage/output_tokens", true),
			}},
		}, {
			Name: "reports-deferred", Match: Match{Methods: []string{"POST"}, Path: "/reports"},
			Key: []KeyPart{{KeyIP, ""}}, OnLimit: OnLimitReject, Action: ActionEnqueue, Queue: "reports",
		}},
	}
	want.source = got.source // the file's bytes, checked by the watcher tests
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Load(%s):\n got %+v\nwant %+v", path, got, want)
		for i := range min(len(got.Rules), len(want.Rules)) {
			if !reflect.DeepEqual(got.Rules[i], want.Rules[i]) {
				t.Errorf("rules[%d]:\n got %+v\nwant %+v", i, got.Rules[i], want.Rules[i])
			}
		}
		for i := range min(len(got.Queues), len(want.Queues)) {
			if !reflect.DeepEqual(got.Queues[i], want.Queues[i]) {
				t.Errorf("queues[%d]:\n got %+v\nwant %+v", i, got.Queues[i], want.Queues[i])
			}
		}
	}

	// Every algorithm is exercised by the example.
	seen := map[limit.Algorithm]bool{}
	for _, r := range got.Rules {
		seen[r.Algorithm] = true
	}
	for _, a := range limit.Algorithms {
		if !seen[a] {
			t.Errorf("full.yaml has no rule with algorithm %s", a)
		}
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Load of a missing file: %v, want os.ErrNotExist", err)
	}
}

func TestDefaults(t *testing.T) {
	got := mustParse(t, `
queues:
  - name: q
    rate: 1/s
rules:
  - {name: r, algorithm: gcra, limit: 1, period: 1s}
upstream: http://up
`)
	want := &Config{
		Path: "sluice.yaml", Listen: "127.0.0.1:8080", AdminListen: "127.0.0.1:9090", Upstream: "http://up",
		DataDir: "./data", OnStoreError: StoreErrorAllow, StoreTimeout: 50 * time.Millisecond,
		ShutdownTimeout: 10 * time.Second, JobRetention: 24 * time.Hour, MaxHeaderBytes: 64 << 10,
		ReadTimeout: 30 * time.Second, ReadAheadBytes: DefaultReadAheadBytes, IPv6Prefix: 64, FormatSuffixes: DefaultFormatSuffixes,
		Queues: []Queue{{
			Name: "q", Rate: Rate{1, time.Second}, MaxDepth: 100000, MaxBodyBytes: 1 << 20, MaxBytes: DefaultMaxBytes, MaxAttempts: 8,
			Backoff: Backoff{time.Second, 5 * time.Minute}, Timeout: 10 * time.Second,
			DedupeWindow: 24 * time.Hour, AckWait: 30 * time.Second, MaxDelay: 30 * 24 * time.Hour, Concurrency: 4, MaxPauseRetries: 20, PauseScope: PauseQueue,
			MinRate: Rate{1, time.Second},
		}},
		Rules: []Rule{{
			Name: "r", Match: Match{Path: "/*"}, Key: []KeyPart{{Kind: KeyIP}}, Algorithm: limit.GCRA,
			Limit: 1, Period: time.Second, OnLimit: OnLimitReject, Action: ActionLimit,
		}},
	}
	want.source = got.source
	if !reflect.DeepEqual(got, want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", got, want)
	}
	if got.Redis != nil || got.NATS != nil {
		t.Errorf("Redis %v, NATS %v: want nil without sections", got.Redis, got.NATS)
	}

	// Only the backoff key given gets its value; the other keeps its default.
	c := mustParse(t, "queues: [{name: q, rate: 1/s, backoff: {initial: 2s}}]\n")
	if b := c.Queues[0].Backoff; b != (Backoff{2 * time.Second, 5 * time.Minute}) {
		t.Errorf("backoff with only initial = %+v", b)
	}
	// A nats section without replicas gets 1.
	c = mustParse(t, "nats: {url: 'nats://a:4222'}\n")
	if c.NATS == nil || c.NATS.Replicas != 1 || c.NATS.JetStreamDomain != "" {
		t.Errorf("nats = %+v, want replicas 1 and no JetStream domain", c.NATS)
	}
	// A domain is one subject token, any of nats-server's: letters, digits, '-', '_', '$'.
	c = mustParse(t, "nats: {url: 'nats://a:4222', jetstream_domain: Hub-eu_1}\n")
	if c.NATS.JetStreamDomain != "Hub-eu_1" {
		t.Errorf("nats.jetstream_domain = %q, want Hub-eu_1", c.NATS.JetStreamDomain)
	}
	// Explicit values that are also allowed zeros stay zero.
	c = mustParse(t, "queues: [{name: q, rate: 1/s, max_pause_retries: 0, burst: 0}]\n")
	if q := c.Queues[0]; q.MaxPauseRetries != 0 || q.Burst != 0 {
		t.Errorf("explicit zeros = %d, %d", q.MaxPauseRetries, q.Burst)
	}
}

func TestEnvOverrides(t *testing.T) {
	env := func(m map[string]string) func(string) string {
		return func(k string) string { return m[k] }
	}
	file := "listen: 127.0.0.1:1\nadmin_listen: 127.0.0.1:2\nredis: {url: 'redis://file:6379'}\nnats: {url: 'nats://file:4222', replicas: 3}\n"

	c, err := Parse("sluice.yaml", []byte(file), env(map[string]string{
		EnvRedisURL: "rediss://user:pw@env:6380/1", EnvNATSURL: "nats://a:4222,nats://b:4222",
		EnvListen: ":8081", EnvAdminListen: "127.0.0.1:9191",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Redis.URL != "rediss://user:pw@env:6380/1" || c.NATS.URL != "nats://a:4222,nats://b:4222" ||
		c.Listen != ":8081" || c.AdminListen != "127.0.0.1:9191" {
		t.Errorf("env did not override the file: %+v redis %+v nats %+v", c, c.Redis, c.NATS)
	}
	if c.NATS.Replicas != 3 {
		t.Errorf("replicas = %d: overriding the URL must keep the file's replicas", c.NATS.Replicas)
	}

	// Empty variables are unset.
	c, err = Parse("sluice.yaml", []byte(file), env(map[string]string{EnvListen: ""}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:1" || c.Redis.URL != "redis://file:6379" {
		t.Errorf("empty env changed the config: listen %q redis %q", c.Listen, c.Redis.URL)
	}

	// The variables create the sections the file lacks.
	c, err = Parse("sluice.yaml", []byte("data_dir: d\n"), env(map[string]string{
		EnvRedisURL: "redis://r:6379", EnvNATSURL: "n:4222",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Redis == nil || c.Redis.URL != "redis://r:6379" || c.NATS == nil || c.NATS.URL != "n:4222" || c.NATS.Replicas != 1 {
		t.Errorf("sections from env: redis %+v nats %+v", c.Redis, c.NATS)
	}

	// A bad value from the environment names its variable, and never echoes the URL.
	_, err = Parse("sluice.yaml", []byte("data_dir: d\n"), env(map[string]string{
		EnvRedisURL: "http://u:hunter2@r", EnvListen: "nope",
	}))
	want := []string{
		`sluice.yaml: listen (from SLUICE_LISTEN): invalid address "nope": want host:port`,
		`sluice.yaml: redis.url (from SLUICE_REDIS_URL): scheme "http" is not redis or rediss`,
	}
	if err == nil || err.Error() != strings.Join(want, "\n") {
		t.Errorf("bad env: got\n%v\nwant\n%s", err, strings.Join(want, "\n"))
	}
	if err != nil && strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error leaks the password: %v", err)
	}
}

func TestProblems(t *testing.T) {
	// ok is a valid file the cases extend with a broken rule, queue or key.
	const head = "upstream: http://127.0.0.1:9000\nqueues:\n  - {name: orders, rate: 50/s}\n"
	rule := func(r string) string {
		return head + "rules:\n  - {name: ok, algorithm: gcra, limit: 1, period: 1s}\n  - " + r + "\n"
	}
	queue := func(q string) string { return "queues:\n  - {name: ok, rate: 1/s}\n  - " + q + "\n" }
	for _, tc := range []struct {
		name, yaml, want string
	}{
		// Rules: the example of the contract, at rules[2].
		{"period zero", head + "rules:\n  - {name: a, algorithm: gcra, limit: 1, period: 1s}\n  - {name: b, algorithm: gcra, limit: 1, period: 1s}\n  - {name: login, algorithm: gcra, limit: 5, period: 0s}\n",
			`sluice.yaml: rules[2] "login": period must be > 0`},
		{"period huge", rule("{name: r, algorithm: gcra, limit: 1, period: 2562047h}"), `sluice.yaml: rules[1] "r": period must be at most 8784h0m0s, got 2562047h0m0s`},
		{"period negative", rule("{name: r, algorithm: gcra, limit: 1, period: -1s}"), `sluice.yaml: rules[1] "r": period must be > 0`},
		{"period not a duration", rule("{name: r, algorithm: gcra, limit: 1, period: 10}"),
			`sluice.yaml: rules[1] "r": period: invalid duration "10": want a Go duration such as 500ms, 10s, 5m or 24h`},
		{"period missing", rule("{name: r, algorithm: gcra, limit: 1}"), `sluice.yaml: rules[1] "r": period is required`},
		{"limit zero", rule("{name: r, algorithm: gcra, limit: 0, period: 1s}"), `sluice.yaml: rules[1] "r": limit must be > 0`},
		{"limit not a number", rule("{name: r, algorithm: gcra, limit: ten, period: 1s}"), `sluice.yaml: rules[1] "r": limit: want an integer, got "ten"`},
		{"limit too big", rule("{name: r, algorithm: gcra, limit: 99999999999999999999, period: 1s}"), `sluice.yaml: rules[1] "r": limit: 99999999999999999999 is out of range`},
		{"limit missing", rule("{name: r, algorithm: gcra, period: 1s}"), `sluice.yaml: rules[1] "r": limit is required`},
		{"burst negative", rule("{name: r, algorithm: gcra, limit: 1, period: 1s, burst: -1}"), `sluice.yaml: rules[1] "r": burst must be >= 0`},
		{"algorithm unknown", rule("{name: r, algorithm: magic, limit: 1, period: 1s}"),
			`sluice.yaml: rules[1] "r": algorithm: unknown algorithm "magic": want token_bucket, leaky_bucket, fixed_window, sliding_log, sliding_window, gcra or concurrency`},

		// Concurrency rules: a limit in flight, no period or burst, a timeout of their own.
		{"concurrency period", rule("{name: conns, algorithm: concurrency, limit: 4, period: 1s}"),
			`sluice.yaml: rules[1] "conns": period does not apply to algorithm: concurrency (limit counts requests in flight; timeout bounds each)`},
		{"concurrency burst", rule("{name: conns, algorithm: concurrency, limit: 4, burst: 2}"),
			`sluice.yaml: rules[1] "conns": burst does not apply to algorithm: concurrency`},
		{"concurrency limit zero", rule("{name: conns, algorithm: concurrency, limit: 0}"),
			`sluice.yaml: rules[1] "conns": limit must be between 1 and 100000 requests in flight, got 0`},
		{"concurrency limit negative", rule("{name: conns, algorithm: concurrency, limit: -3}"),
			`sluice.yaml: rules[1] "conns": limit must be between 1 and 100000 requests in flight, got -3`},
		{"concurrency limit missing", rule("{name: conns, algorithm: concurrency}"),
			`sluice.yaml: rules[1] "conns": limit is required: the requests of a key in flight at once`},
		{"concurrency timeout zero", rule("{name: conns, algorithm: concurrency, limit: 4, timeout: 0s}"),
			`sluice.yaml: rules[1] "conns": timeout must be > 0`},
		{"concurrency timeout huge", rule("{name: conns, algorithm: concurrency, limit: 4, timeout: 25h}"),
			`sluice.yaml: rules[1] "conns": timeout must be at most 24h0m0s, got 25h0m0s`},
		{"timeout without concurrency", rule("{name: r, algorithm: gcra, limit: 1, period: 1s, timeout: 5s}"),
			`sluice.yaml: rules[1] "r": timeout applies only to algorithm: concurrency (a queue's timeout bounds its deliveries)`},
		{"concurrency lease", rule("{name: conns, algorithm: concurrency, limit: 4, lease: 2}"),
			`sluice.yaml: rules[1] "conns": lease does not apply to algorithm: concurrency`},
		{"concurrency action enqueue", rule("{name: conns, algorithm: concurrency, limit: 4, action: enqueue, queue: orders}"),
			`sluice.yaml: rules[1] "conns": algorithm: concurrency caps forwarded requests; a rule with action: enqueue forwards none`},
		{"algorithm missing", rule("{name: r, limit: 1, period: 1s}"), `sluice.yaml: rules[1] "r": algorithm is required`},
		{"name missing", rule("{algorithm: gcra, limit: 1, period: 1s}"), `sluice.yaml: rules[1]: name is required`},
		{"name duplicate", rule("{name: ok, algorithm: gcra, limit: 1, period: 1s}"), `sluice.yaml: rules[1] "ok": name: duplicate of rules[0]`},
		{"on_limit invalid", rule("{name: r, algorithm: gcra, limit: 1, period: 1s, on_limit: drop}"),
			`sluice.yaml: rules[1] "r": on_limit: invalid value "drop": want reject or enqueue`},
		{"on_limit enqueue without queue", rule("{name: r, algorithm: gcra, limit: 1, period: 1s, on_limit: enqueue}"),
			`sluice.yaml: rules[1] "r": queue is required when on_limit is enqueue`},
		{"action invalid", rule("{name: r, algorithm: gcra, limit: 1, period: 1s, action: forward}"),
			`sluice.yaml: rules[1] "r": action: invalid value "forward": want limit or enqueue`},
		{"action enqueue without queue", rule("{name: r, action: enqueue}"), `sluice.yaml: rules[1] "r": queue is required when action is enqueue`},
		{"action enqueue with half a limit", rule("{name: r, action: enqueue, queue: orders, limit: 5}"),
			`sluice.yaml: rules[1] "r": algorithm is required when limit, period or burst is set`},
		{"action enqueue with a bad limit", rule("{name: r, action: enqueue, queue: orders, algorithm: gcra, limit: 5, period: 0s}"),
			`sluice.yaml: rules[1] "r": period must be > 0`},
		{"queue unknown", rule("{name: r, algorithm: gcra, limit: 1, period: 1s, on_limit: enqueue, queue: ordrs}"),
			`sluice.yaml: rules[1] "r": queue: no queue named "ordrs"`},
		{"shadow not a bool", rule("{name: r, algorithm: gcra, limit: 1, period: 1s, shadow: maybe}"),
			`sluice.yaml: rules[1] "r": shadow: want true or false, got "maybe"`},
		{"rule on_store_error", rule("{name: r, algorithm: gcra, limit: 1, period: 1s, on_store_error: ignore}"),
			`sluice.yaml: rules[1] "r": on_store_error: invalid value "ignore": want allow or deny`},
		{"rule on_store_reset", rule("{name: r, algorithm: gcra, limit: 1, period: 1s, on_store_reset: conservative}"),
			`sluice.yaml: rules[1] "r": on_store_reset: invalid value "conservative": want allow (start afresh) or hold (refuse until the limit would be whole again)`},
		{"on_store_reset on a concurrency rule", rule("{name: r, algorithm: concurrency, limit: 1, on_store_reset: hold}"),
			`sluice.yaml: rules[1] "r": on_store_reset applies to rules with a limit per period: a concurrency rule's places are fenced after a loss of Redis's state by themselves`},
		{"on_store_reset without a limit", rule("{name: r, action: enqueue, queue: orders, on_store_reset: allow}"),
			`sluice.yaml: rules[1] "r": on_store_reset applies to rules with a limit per period: set algorithm, limit and period, or drop it`},
		{"path relative", rule("{name: r, algorithm: gcra, limit: 1, period: 1s, match: {path: api/orders}}"),
			`sluice.yaml: rules[1] "r": match.path must start with "/"`},
		{"path inner star", rule("{name: r, algorithm: gcra, limit: 1, period: 1s, match: {path: /api/*/orders}}"),
			`sluice.yaml: rules[1] "r": match.path: invalid path "/api/*/orders": "*" is allowed only as a trailing "/*"`},
		{"path star glued", rule("{name: r, algorithm: gcra, limit: 1, period: 1s, match: {path: /api*}}"),
			`sluice.yaml: rules[1] "r": match.path: invalid path "/api*": "*" is allowed only as a trailing "/*"`},
		{"path query", rule("{name: r, algorithm: gcra, limit: 1, period: 1s, match: {path: '/a?b=1'}}"),
			`sluice.yaml: rules[1] "r": match.path: invalid path "/a?b=1": a path holds no query or fragment`},
		{"method invalid", rule("{name: r, algorithm: gcra, limit: 1, period: 1s, match: {methods: [GET, 'P OST']}}"),
			`sluice.yaml: rules[1] "r": match.methods[1]: invalid method "P OST"`},
		{"key unknown", rule("{name: r, algorithm: gcra, limit: 1, period: 1s, key: [ip, 'cookie:sid']}"),
			`sluice.yaml: rules[1] "r": key[1]: unknown part "cookie:sid": want ip, header:NAME, query:NAME, method, path or const:TEXT`},
		{"key header without name", rule("{name: r, algorithm: gcra, limit: 1, period: 1s, key: ['header:']}"),
			`sluice.yaml: rules[1] "r": key[0]: "header:" needs a header name`},
		{"key header bad name", rule("{name: r, algorithm: gcra, limit: 1, period: 1s, key: ['header:X Key']}"),
			`sluice.yaml: rules[1] "r": key[0]: invalid header name "X Key"`},
		{"key query without name", rule("{name: r, algorithm: gcra, limit: 1, period: 1s, key: ['query:']}"),
			`sluice.yaml: rules[1] "r": key[0]: "query:" needs a parameter name`},
		{"key const without text", rule("{name: r, algorithm: gcra, limit: 1, period: 1s, key: ['const:']}"),
			`sluice.yaml: rules[1] "r": key[0]: "const:" needs text`},
		{"key ip with argument", rule("{name: r, algorithm: gcra, limit: 1, period: 1s, key: ['ip:v4']}"),
			`sluice.yaml: rules[1] "r": key[0]: "ip" takes no argument`},

		// Queues.
		{"rate invalid", "queues:\n  - {name: orders, rate: fast}\n",
			`sluice.yaml: queues[0] "orders": rate: invalid rate "fast": want N/s, N/m, N/h or N/<duration>`},
		{"rate zero", queue("{name: q, rate: 0/s}"), `sluice.yaml: queues[1] "q": rate: invalid rate "0/s": count must be > 0`},
		{"rate missing", queue("{name: q}"), `sluice.yaml: queues[1] "q": rate is required`},
		{"queue name missing", queue("{rate: 1/s}"), `sluice.yaml: queues[1]: name is required`},
		{"queue name invalid", queue("{name: 'a.b', rate: 1/s}"),
			`sluice.yaml: queues[1] "a.b": name: invalid name "a.b": want 1 to 64 of A-Z, a-z, 0-9, _ and -`},
		{"queue name too long", queue("{name: " + strings.Repeat("q", 65) + ", rate: 1/s}"),
			`sluice.yaml: queues[1] "` + strings.Repeat("q", 65) + `": name: invalid name "` + strings.Repeat("q", 65) + `": want 1 to 64 of A-Z, a-z, 0-9, _ and -`},
		{"queue name duplicate", queue("{name: ok, rate: 1/s}"), `sluice.yaml: queues[1] "ok": name: duplicate of queues[0]`},
		{"queue burst", queue("{name: q, rate: 1/s, burst: -2}"), `sluice.yaml: queues[1] "q": burst must be between 0 and 1000000, got -2`},
		{"max_depth", queue("{name: q, rate: 1/s, max_depth: 0}"), `sluice.yaml: queues[1] "q": max_depth must be between 1 and 4294967296, got 0`},
		{"max_body_bytes", queue("{name: q, rate: 1/s, max_body_bytes: -1}"), `sluice.yaml: queues[1] "q": max_body_bytes must be between 1 and 67108864, got -1`},
		{"max_attempts", queue("{name: q, rate: 1/s, max_attempts: 0}"), `sluice.yaml: queues[1] "q": max_attempts must be between 1 and 1000, got 0`},
		{"backoff initial", queue("{name: q, rate: 1/s, backoff: {initial: 0s}}"), `sluice.yaml: queues[1] "q": backoff.initial must be > 0`},
		{"backoff max", queue("{name: q, rate: 1/s, backoff: {initial: 10s, max: 1s}}"), `sluice.yaml: queues[1] "q": backoff.max must be >= backoff.initial`},
		{"backoff initial above default max", queue("{name: q, rate: 1/s, backoff: {initial: 10m}}"), `sluice.yaml: queues[1] "q": backoff.max must be >= backoff.initial`},
		{"timeout", queue("{name: q, rate: 1/s, timeout: 0s}"), `sluice.yaml: queues[1] "q": timeout must be > 0`},
		{"timeout syntax", queue("{name: q, rate: 1/s, timeout: soon}"),
			`sluice.yaml: queues[1] "q": timeout: invalid duration "soon": want a Go duration such as 500ms, 10s, 5m or 24h`},
		{"dedupe_window", queue("{name: q, rate: 1/s, dedupe_window: -1h}"), `sluice.yaml: queues[1] "q": dedupe_window must be > 0`},
		{"ack_wait", queue("{name: q, rate: 1/s, ack_wait: 10ms}"), `sluice.yaml: queues[1] "q": ack_wait must be at least 100ms`},
		{"concurrency", queue("{name: q, rate: 1/s, concurrency: 0}"), `sluice.yaml: queues[1] "q": concurrency must be between 1 and 10000, got 0`},
		{"min_rate above rate", queue("{name: q, rate: 1/s, adaptive: true, min_rate: 2/s}"), `sluice.yaml: queues[1] "q": min_rate 2/s must not exceed rate 1/s`},
		{"concurrency huge", queue("{name: q, rate: 1/s, concurrency: 100000000}"), `sluice.yaml: queues[1] "q": concurrency must be between 1 and 10000, got 100000000`},
		{"max_body_bytes huge", queue("{name: q, rate: 1/s, max_body_bytes: 99999999999}"), `sluice.yaml: queues[1] "q": max_body_bytes must be between 1 and 67108864, got 99999999999`},
		{"max_depth huge", queue("{name: q, rate: 1/s, max_depth: 9223372036854775807}"), `sluice.yaml: queues[1] "q": max_depth must be between 1 and 4294967296, got 9223372036854775807`},
		{"ack_wait huge", queue("{name: q, rate: 1/s, ack_wait: 100000h}"), `sluice.yaml: queues[1] "q": ack_wait must be at most 8784h0m0s, got 100000h0m0s`},
		{"tenant part", queue("{name: q, rate: 1/s, tenant: [cookie:x]}"), `sluice.yaml: queues[1] "q": tenant[0]: unknown part "cookie:x": want ip, header:NAME, query:NAME, method, path or const:TEXT`},
		{"lease without a limit", "upstream: http://u\nqueues: [{name: q, rate: 1/s}]\nrules: [{name: r, action: enqueue, queue: q, lease: 5}]\n", `sluice.yaml: rules[0] "r": lease needs a limit (algorithm, limit and period)`},
		{"lease above limit", "upstream: http://u\nrules: [{name: r, algorithm: gcra, limit: 5, period: 1s, lease: 6}]\n", `sluice.yaml: rules[0] "r": lease 6 must not exceed limit 5`},
		{"lease negative", "upstream: http://u\nrules: [{name: r, algorithm: gcra, limit: 5, period: 1s, lease: -1}]\n", `sluice.yaml: rules[0] "r": lease must be between 0 and 10000, got -1`},
		{"fair without tenant", queue("{name: q, rate: 1/s, fair: true}"), `sluice.yaml: queues[1] "q": fair: true needs tenant: the key parts that name who a job belongs to`},
		{"weights without fair", queue("{name: q, rate: 1/s, tenant: [ip], weights: {a: 2}}"), `sluice.yaml: queues[1] "q": weights and tenant_rate need fair: true`},
		{"cost bad source", rule("{name: r, algorithm: gcra, limit: 10, period: 1s, cost: cookie:x}"),
			`sluice.yaml: rules[1] "r": cost: "cookie:x": want header:NAME, query:NAME, json:<JSON pointer>, body_bytes or a number`},
		{"cost bad pointer", rule("{name: r, algorithm: gcra, limit: 10, period: 1s, cost: 'json:max_tokens'}"),
			`sluice.yaml: rules[1] "r": cost: "json:max_tokens": a JSON pointer starts with / (json:/usage/total_tokens)`},
		{"cost bad escape", rule("{name: r, algorithm: gcra, limit: 10, period: 1s, cost: 'json:/a~2'}"),
			`sluice.yaml: rules[1] "r": cost: "json:/a~2": ~ in a JSON pointer must be followed by 0 or 1 (~0 is ~, ~1 is /)`},
		{"cost zero", rule("{name: r, algorithm: gcra, limit: 10, period: 1s, cost: 0}"),
			`sluice.yaml: rules[1] "r": cost: a fixed cost must be between 1 and 1099511627776, got 0`},
		{"cost above capacity", rule("{name: r, algorithm: gcra, limit: 10, period: 1s, cost: 11}"),
			`sluice.yaml: rules[1] "r": cost 11 exceeds what the limit can ever admit at once (10)`},
		{"cost on concurrency", rule("{name: r, algorithm: concurrency, limit: 4, cost: body_bytes}"),
			`sluice.yaml: rules[1] "r": cost does not apply to algorithm: concurrency (it counts requests in flight)`},
		{"cost without limit", rule("{name: r, action: enqueue, queue: orders, cost: body_bytes}"),
			`sluice.yaml: rules[1] "r": cost needs a limit (algorithm, limit and period) to charge`},
		{"cost with lease", rule("{name: r, algorithm: gcra, limit: 10, period: 1s, lease: 2, cost: header:x-cost}"),
			`sluice.yaml: rules[1] "r": lease takes requests ahead one unit each; it does not apply to a rule with a cost`},
		{"cost expression unclosed", rule("{name: r, algorithm: gcra, limit: 10, period: 1s, cost: 'max(json:/a, 5'}"),
			`sluice.yaml: rules[1] "r": cost: "max(json:/a, 5": want , or ) at 14`},
		{"cost expression product of sources", rule("{name: r, algorithm: gcra, limit: 10, period: 1s, cost: 'json:/a * json:/b'}"),
			`sluice.yaml: rules[1] "r": cost: "json:/a * json:/b": one side of * must be a whole number (a factor)`},
		{"cost expression unknown function", rule("{name: r, algorithm: gcra, limit: 10, period: 1s, cost: 'min(json:/a, 5)'}"),
			`sluice.yaml: rules[1] "r": cost: "min(json:/a, 5)": unknown function "min" (want max, sum or prompt_tokens)`},
		{"prompt_tokens of a header", rule("{name: r, algorithm: gcra, limit: 10, period: 1s, cost: 'prompt_tokens(header:x)'}"),
			`sluice.yaml: rules[1] "r": cost: "prompt_tokens(header:x)": prompt_tokens takes json:<pointer> to the text (json:/messages)`},
		{"prompt_tokens unknown tokenizer", rule("{name: r, algorithm: gcra, limit: 10, period: 1s, cost: 'prompt_tokens(json:/m, llama)'}"),
			`sluice.yaml: rules[1] "r": cost: "prompt_tokens(json:/m, llama)": prompt_tokens' second argument is bytes per token (a whole number from 1 to 16) or a tokenizer (o200k, cl100k)`},
		{"cost_from_response with sliding_log", rule("{name: r, algorithm: sliding_log, limit: 10, period: 1s, cost_from_response: 'json:/u'}"),
			`sluice.yaml: rules[1] "r": cost_from_response needs an algorithm that carries debt: sliding_log keeps one entry per unit within one period and would drop what the answer owes beyond it; use sliding_window`},
		{"read_ahead_bytes too small", "read_ahead_bytes: 1000\nrules: []\n",
			`sluice.yaml: read_ahead_bytes must be between 1048577 and 17179869184, got 1000`},
		{"cost_on_cut unknown", rule("{name: r, algorithm: gcra, limit: 10, period: 1s, cost_from_response: 'json:/u', cost_on_cut: zero}"),
			`sluice.yaml: rules[1] "r": cost_on_cut: invalid value "zero": want estimate or deltas`},
		{"cost_on_cut without cost_from_response", rule("{name: r, algorithm: gcra, limit: 10, period: 1s, cost: 'json:/n', cost_on_cut: deltas}"),
			`sluice.yaml: rules[1] "r": cost_on_cut says what a streamed answer cut short is charged: it needs cost_from_response`},
		{"cut_on_debt negative", rule("{name: r, algorithm: gcra, limit: 10, period: 1s, cost_from_response: 'json:/u', cut_on_debt: -5}"),
			`sluice.yaml: rules[1] "r": cut_on_debt must be between 1 and 1099511627776, got -5`},
		{"cut_on_debt without cost_from_response", rule("{name: r, algorithm: gcra, limit: 10, period: 1s, cut_on_debt: 100}"),
			`sluice.yaml: rules[1] "r": cut_on_debt ends a streamed answer that owes more than it was charged: it needs cost_from_response`},
		{"cost_from_response query", rule("{name: r, algorithm: gcra, limit: 10, period: 1s, cost_from_response: query:n}"),
			`sluice.yaml: rules[1] "r": cost_from_response: "query:n": want header:NAME or json:<JSON pointer> (what the upstream's answer carries)`},
		{"cost_from_response number", rule("{name: r, algorithm: gcra, limit: 10, period: 1s, cost_from_response: 5}"),
			`sluice.yaml: rules[1] "r": cost_from_response: "5": want header:NAME or json:<JSON pointer> (what the upstream's answer carries)`},
		{"cost_fallback above capacity", rule("{name: r, algorithm: gcra, limit: 10, period: 1s, cost: header:x-cost, cost_fallback: 11}"),
			`sluice.yaml: rules[1] "r": cost_fallback must be between 1 and 10, got 11`},
		{"cost_fallback of a fixed cost", rule("{name: r, algorithm: gcra, limit: 10, period: 1s, cost: 2, cost_fallback: 3}"),
			`sluice.yaml: rules[1] "r": cost_fallback applies to a cost read from the request (header, query, json or body_bytes)`},
		{"queue cost without cost_rate", queue("{name: q, rate: 1/s, cost: 'json:/max_tokens'}"),
			`sluice.yaml: queues[1] "q": cost needs cost_rate, the units per period the queue drains`},
		{"queue cost_from_response without cost_rate", queue("{name: q, rate: 1/s, cost_from_response: 'json:/usage/total_tokens'}"),
			`sluice.yaml: queues[1] "q": cost_from_response needs cost_rate, the units per period the queue drains`},
		{"queue cost_rate bad", queue("{name: q, rate: 1/s, cost_rate: lots}"),
			`sluice.yaml: queues[1] "q": cost_rate: invalid rate "lots": want N/s, N/m, N/h or N/<duration>`},
		{"queue cost above capacity", queue("{name: q, rate: 1/s, cost_rate: 100/m, cost: 101}"),
			`sluice.yaml: queues[1] "q": cost 101 exceeds what cost_rate and cost_burst can ever deliver at once (100)`},
		{"queue cost_burst negative", queue("{name: q, rate: 1/s, cost_rate: 100/m, cost_burst: -1}"),
			`sluice.yaml: queues[1] "q": cost_burst must be between 0 and 1099511627776, got -1`},
		{"tenant_rate without fair", queue("{name: q, rate: 1/s, tenant: [ip], tenant_rate: 1/s}"), `sluice.yaml: queues[1] "q": weights and tenant_rate need fair: true`},
		{"tenant_in_flight without fair", queue("{name: q, rate: 1/s, tenant: [ip], tenant_in_flight: 2}"), `sluice.yaml: queues[1] "q": tenant_in_flight and pause_scope: tenant need fair: true`},
		{"pause_scope tenant without fair", queue("{name: q, rate: 1/s, pause_scope: tenant}"), `sluice.yaml: queues[1] "q": tenant_in_flight and pause_scope: tenant need fair: true`},
		{"bad pause_scope", queue("{name: q, rate: 1/s, pause_scope: key}"), `sluice.yaml: queues[1] "q": pause_scope: want queue or tenant, got "key"`},
		{"bad fair_by", queue("{name: q, rate: 1/s, tenant: [ip], fair: true, cost_rate: 100/s, fair_by: tokens}"), `sluice.yaml: queues[1] "q": fair_by: want jobs or units, got "tokens"`},
		{"fair_by without fair", queue("{name: q, rate: 1/s, tenant: [ip], cost_rate: 100/s, fair_by: units}"), `sluice.yaml: queues[1] "q": fair_by needs fair: true`},
		{"fair_by jobs without fair", queue("{name: q, rate: 1/s, fair_by: jobs}"), `sluice.yaml: queues[1] "q": fair_by needs fair: true`},
		{"fair_by units without cost_rate", queue("{name: q, rate: 1/s, tenant: [ip], fair: true, fair_by: units}"), `sluice.yaml: queues[1] "q": fair_by: units needs cost_rate, the units the tenants share`},
		{"negative max_in_flight", queue("{name: q, rate: 1/s, max_in_flight: -1}"), `sluice.yaml: queues[1] "q": max_in_flight must be between 0 and 1000000, got -1`},
		{"tenant_in_flight above max_in_flight", queue("{name: q, rate: 1/s, tenant: [ip], fair: true, max_in_flight: 2, tenant_in_flight: 3}"), `sluice.yaml: queues[1] "q": tenant_in_flight 3 must not exceed max_in_flight 2`},
		{"tenant_settings without fair", queue("{name: q, rate: 1/s, tenant: [ip], tenant_settings: {a: {weight: 2}}}"), `sluice.yaml: queues[1] "q": tenant_settings need fair: true`},
		{"tenant_settings bad weight", queue("{name: q, rate: 1/s, tenant: [ip], fair: true, tenant_settings: {a: {weight: 0}}}"), `sluice.yaml: queues[1] "q": tenant_settings.a.weight: want a number > 0 and <= 1000, got "0"`},
		{"tenant_settings bad rate", queue("{name: q, rate: 1/s, tenant: [ip], fair: true, tenant_settings: {a: {rate: fast}}}"), `sluice.yaml: queues[1] "q": tenant_settings.a.rate: invalid rate "fast": want N/s, N/m, N/h or N/<duration>`},
		{"tenant_settings bad in_flight", queue("{name: q, rate: 1/s, tenant: [ip], fair: true, tenant_settings: {a: {in_flight: 0}}}"), `sluice.yaml: queues[1] "q": tenant_settings.a.in_flight must be between 1 and 1000000, got 0`},
		{"tenant_settings label is the value", queue("{name: q, rate: 1/s, tenant: [ip], fair: true, tenant_settings: {sk-live-1: {label: sk-live-1}}}"), `sluice.yaml: queues[1] "q": tenant_settings.sk-live-1.label: must not be the tenant's value, which admin reads never show; name the tenant instead (such as "acme")`},
		{"tenant_settings label too long", queue("{name: q, rate: 1/s, tenant: [ip], fair: true, tenant_settings: {a: {label: " + strings.Repeat("x", 65) + "}}}"), `sluice.yaml: queues[1] "q": tenant_settings.a.label: want up to 64 printable characters`},
		{"tenant_settings unknown key", queue("{name: q, rate: 1/s, tenant: [ip], fair: true, tenant_settings: {a: {burst: 2}}}"), `sluice.yaml:3: queues[1] "q": unknown field "burst"`},
		{"tenant_max_depth without tenant", queue("{name: q, rate: 1/s, tenant_max_depth: 100}"), `sluice.yaml: queues[1] "q": tenant_max_depth needs tenant (whose jobs it counts)`},
		{"tenant_max_depth 0", queue("{name: q, rate: 1/s, tenant: [ip], fair: true, tenant_max_depth: 0}"), `sluice.yaml: queues[1] "q": tenant_max_depth must be between 1 and 100000, got 0`},
		{"tenant_max_depth negative", queue("{name: q, rate: 1/s, tenant: [ip], fair: true, tenant_max_depth: -5}"), `sluice.yaml: queues[1] "q": tenant_max_depth must be between 1 and 100000, got -5`},
		{"tenant_max_depth above max_depth", queue("{name: q, rate: 1/s, max_depth: 50, tenant: [ip], fair: true, tenant_max_depth: 51}"), `sluice.yaml: queues[1] "q": tenant_max_depth must be between 1 and 50, got 51`},
		{"tenant_max_depth text", queue("{name: q, rate: 1/s, tenant: [ip], fair: true, tenant_max_depth: lots}"), `sluice.yaml: queues[1] "q": tenant_max_depth: want an integer, got "lots"`},
		{"weight zero", queue("{name: q, rate: 1/s, tenant: [ip], fair: true, weights: {a: 0}}"), `sluice.yaml: queues[1] "q": weights.a: 0 is out of range: want > 0 and <= 1000`},
		{"weight word", queue("{name: q, rate: 1/s, tenant: [ip], fair: true, weights: {a: lots}}"), `sluice.yaml: queues[1] "q": weights.a: want a number, got "lots"`},
		{"weights list", queue("{name: q, rate: 1/s, tenant: [ip], fair: true, weights: [a]}"), `sluice.yaml: queues[1] "q": weights: want a mapping of tenant to weight, not a list`},
		{"tenant_rate", queue("{name: q, rate: 1/s, tenant: [ip], fair: true, tenant_rate: often}"), `sluice.yaml: queues[1] "q": tenant_rate: invalid rate "often": want N/s, N/m, N/h or N/<duration>`},
		{"max_pause_retries", queue("{name: q, rate: 1/s, max_pause_retries: -1}"), `sluice.yaml: queues[1] "q": max_pause_retries must be between 0 and 10000, got -1`},
		{"target relative", queue("{name: q, rate: 1/s, target: /api/orders}"),
			`sluice.yaml: queues[1] "q": target: want an absolute http or https URL, got "/api/orders"`},
		{"target scheme", queue("{name: q, rate: 1/s, target: 'POST ftp://h/x'}"),
			`sluice.yaml: queues[1] "q": target: want an absolute http or https URL, got "ftp://h/x"`},
		{"target method", queue("{name: q, rate: 1/s, target: 'P(ST http://h/x'}"), `sluice.yaml: queues[1] "q": target: invalid method "P(ST"`},
		{"target words", queue("{name: q, rate: 1/s, target: 'POST http://h/x now'}"),
			`sluice.yaml: queues[1] "q": target: want "[METHOD] URL", got "POST http://h/x now"`},

		// The top level.
		{"listen", "listen: localhost\n", `sluice.yaml: listen: invalid address "localhost": want host:port`},
		{"listen port", "listen: 'localhost:http'\n", `sluice.yaml: listen: invalid port "http": want 0 to 65535`},
		{"admin_listen port range", "admin_listen: ':70000'\n", `sluice.yaml: admin_listen: invalid port "70000": want 0 to 65535`},
		{"upstream missing", "rules: [{name: r, algorithm: gcra, limit: 1, period: 1s}]\n", `sluice.yaml: upstream is required when rules are defined`},
		{"upstream relative", "upstream: 127.0.0.1:9000\n", `sluice.yaml: upstream: want an absolute http or https URL, got "127.0.0.1:9000"`},
		{"trusted_proxies", "trusted_proxies: [10.0.0.0/8, 10.0.0.0/33, bogus]\n", `sluice.yaml: trusted_proxies[1]: invalid CIDR or IP "10.0.0.0/33"`},
		{"trusted_proxies word", "trusted_proxies: [10.0.0.0/8, 10.0.0.0/33, bogus]\n", `sluice.yaml: trusted_proxies[2]: invalid CIDR or IP "bogus"`},
		{"data_dir", "data_dir: ''\n", `sluice.yaml: data_dir must not be empty`},
		{"demo_upstream", "demo_upstream: nine\n", `sluice.yaml: demo_upstream: invalid address "nine": want host:port`},
		{"redis url missing", "redis: {}\n", `sluice.yaml: redis.url is required`},
		{"redis scheme", "redis: {url: 'http://h:6379'}\n", `sluice.yaml: redis.url: scheme "http" is not redis or rediss`},
		{"redis no scheme", "redis: {url: 'h:6379'}\n", `sluice.yaml: redis.url: scheme "h" is not redis or rediss`},
		{"redis bad port", "redis: {url: 'redis://h:port'}\n", `sluice.yaml: redis.url: invalid URL: invalid port ":port" after host`},
		{"nats url missing", "nats: {replicas: 3}\n", `sluice.yaml: nats.url is required`},
		{"nats scheme", "nats: {url: 'nats://a:4222,http://b:4222'}\n", `sluice.yaml: nats.url: server 2: scheme "http" is not nats, tls, ws or wss`},
		{"nats empty server", "nats: {url: 'nats://a:4222,'}\n", `sluice.yaml: nats.url: server 2: empty server`},
		{"nats replicas", "nats: {url: 'nats://a', replicas: 7}\n", `sluice.yaml: nats.replicas must be between 1 and 5`},
		{"nats jetstream_domain dot", "nats: {url: 'nats://a', jetstream_domain: hub.eu}\n",
			`sluice.yaml: nats.jetstream_domain: "hub.eu" is not a JetStream domain: it may not contain '.' (a domain is one token of the subjects $JS.<domain>.API.>, as nats-server's jetstream { domain }: no dots, wildcards or white space)`},
		{"nats jetstream_domain wildcard", "nats: {url: 'nats://a', jetstream_domain: '*'}\n",
			`sluice.yaml: nats.jetstream_domain: "*" is not a JetStream domain: it may not contain '*' (a domain is one token of the subjects $JS.<domain>.API.>, as nats-server's jetstream { domain }: no dots, wildcards or white space)`},
		{"nats jetstream_domain space", "nats: {url: 'nats://a', jetstream_domain: 'my hub'}\n",
			`sluice.yaml: nats.jetstream_domain: "my hub" is not a JetStream domain: it may not contain ' ' (a domain is one token of the subjects $JS.<domain>.API.>, as nats-server's jetstream { domain }: no dots, wildcards or white space)`},
		{"nats jetstream_domain list", "nats: {url: 'nats://a', jetstream_domain: [hub]}\n", `sluice.yaml: nats.jetstream_domain: want a single value, not a list`},
		{"on_store_error", "on_store_error: open\n", `sluice.yaml: on_store_error: invalid value "open": want allow or deny`},
		{"shadow", "shadow: sometimes\n", `sluice.yaml: shadow: want true or false, got "sometimes"`},
		{"store_timeout", "store_timeout: 0s\n", `sluice.yaml: store_timeout must be > 0`},
		{"shutdown_timeout", "shutdown_timeout: 5\n",
			`sluice.yaml: shutdown_timeout: invalid duration "5": want a Go duration such as 500ms, 10s, 5m or 24h`},
		{"job_retention", "job_retention: -24h\n", `sluice.yaml: job_retention must be > 0`},
		{"read_timeout", "read_timeout: 0s\n", `sluice.yaml: read_timeout must be > 0`},
		{"redis cluster seed", "redis: { url: \"redis://127.0.0.1:7000,nohost\" }\n", `sluice.yaml: redis.url: cluster seeds: seed 2: want host:port`},
		{"ipv6_prefix", "ipv6_prefix: 16\n", `sluice.yaml: ipv6_prefix must be between 32 and 128, got 16`},
		{"id_secret", "id_secret: short\n", `sluice.yaml: id_secret must be at least 16 bytes long`},
		{"admin_token short", "admin_token: x\n", `sluice.yaml: admin_token must be at least 16 characters long, got 1`},
		{"admin_token placeholder", "admin_token: Change-Me-0123456789\n",
			"sluice.yaml: admin_token: \"Change-Me-0123456789\" is a placeholder; set a random token of at least 16 characters (such as `openssl rand -hex 16`)"},
		{"admin_hosts url", "admin_hosts: ['http://admin.example']\n", `sluice.yaml: admin_hosts[0]: want a host name or IP, optionally with :port, got "http://admin.example"`},
		{"admin_hosts port", "admin_hosts: [ops, 'ops:99999']\n", `sluice.yaml: admin_hosts[1]: want a host name or IP, optionally with :port, got "ops:99999"`},
		{"format_suffixes no dot", "format_suffixes: [json]\n", `sluice.yaml: format_suffixes[0]: want "." and 1 to 15 letters or digits, such as ".json", got "json"`},
		{"format_suffixes path", "format_suffixes: ['.json', '.x/y']\n", `sluice.yaml: format_suffixes[1]: want "." and 1 to 15 letters or digits, such as ".json", got ".x/y"`},
		{"format_suffixes mapping", "format_suffixes: {json: 1}\n", `sluice.yaml: format_suffixes: want a list, not a mapping`},
		{"admin_hosts mapping", "admin_hosts: {ops: 1}\n", `sluice.yaml: admin_hosts: want a list, not a mapping`},
		{"upstream fragment", "upstream: http://127.0.0.1:9000/x#frag\n", `sluice.yaml: upstream: want an absolute http or https URL, got "http://127.0.0.1:9000/x#frag"`},
		{"max_header_bytes", "max_header_bytes: 0\n", `sluice.yaml: max_header_bytes must be between 1 and 16777216, got 0`},
		{"max_header_bytes syntax", "max_header_bytes: 64KiB\n", `sluice.yaml: max_header_bytes: want an integer, got "64KiB"`},
		{"tracing without otlp", "tracing: {sample_ratio: 0.5}\n", `sluice.yaml: tracing.otlp is required in a tracing section: the collector's OTLP/HTTP URL, such as http://127.0.0.1:4318`},
		{"tracing otlp not a URL", "tracing: {otlp: '127.0.0.1:4318'}\n", `sluice.yaml: tracing.otlp: want an absolute http or https URL, got "127.0.0.1:4318"`},
		{"tracing otlp grpc", "tracing: {otlp: 'grpc://collector:4317'}\n", `sluice.yaml: tracing.otlp: want an absolute http or https URL, got "grpc://collector:4317"`},
		{"tracing sample_ratio above 1", "tracing: {otlp: 'http://c:4318', sample_ratio: 2}\n", `sluice.yaml: tracing.sample_ratio: want a number from 0 to 1, got "2"`},
		{"tracing sample_ratio text", "tracing: {otlp: 'http://c:4318', sample_ratio: half}\n", `sluice.yaml: tracing.sample_ratio: want a number from 0 to 1, got "half"`},
		{"tracing unknown key", "tracing:\n  otlp: 'http://c:4318'\n  endpoint: x\n", `sluice.yaml:3: tracing: unknown field "endpoint"`},
		{"tracing scalar", "tracing: 'http://c:4318'\n", `sluice.yaml:1: tracing: want a mapping, not a single value`},

		// Decoding, with the line YAML gives.
		{"syntax", "listen: [a\n", `sluice.yaml:1: did not find expected ',' or ']'`},
		{"tab", "queues:\n\t- name: q\n", `sluice.yaml:2: found character that cannot start any token`},
		{"unknown top-level field", "listen: ':1'\nlisten_addr: ':2'\n", `sluice.yaml:2: unknown field "listen_addr"`},
		{"unknown rule field", head + "rules:\n  - name: a\n    algorithm: gcra\n    limit: 1\n    period: 1s\n  - name: search\n    algoritm: gcra\n",
			`sluice.yaml:10: rules[1] "search": unknown field "algoritm"`},
		{"unknown nested field", "queues:\n  - name: orders\n    rate: 1/s\n    backoff:\n      intial: 1s\n",
			`sluice.yaml:5: queues[0] "orders": backoff: unknown field "intial"`},
		{"list for a value", "queues:\n  - name: orders\n    rate: [1, s]\n", `sluice.yaml: queues[0] "orders": rate: want a single value, not a list`},
		{"value for a mapping", head + "rules:\n  - name: r\n    match: /api\n", `sluice.yaml:6: rules[0] "r": match: want a mapping, not a single value`},
		{"mapping for a list", "rules: {name: r}\n", `sluice.yaml:1: rules: want a list, not a mapping`},
		{"mapping in a list", head + "rules:\n  - name: r\n    key:\n      - {header: x}\n", `sluice.yaml: rules[0] "r": key[0]: want a single value, not a mapping`},
		{"mapping for a list of values", head + "rules:\n  - name: r\n    match:\n      methods: {get: true}\n", `sluice.yaml: rules[0] "r": match.methods: want a list, not a mapping`},
		{"scalar for a rule", head + "rules:\n  - {name: a, algorithm: gcra, limit: 1, period: 1s}\n  - just-a-name\n", `sluice.yaml:6: rules[1]: want a mapping, not a single value`},
		{"not a mapping", "- a\n- b\n", `sluice.yaml:1: want a mapping, not a list`},
		{"duplicate key", "listen: ':1'\nlisten: ':2'\n", `sluice.yaml:2: mapping key "listen" already defined at line 1`},
		{"empty", "", `sluice.yaml: file is empty`},
		{"only comments", "# nothing yet\n", `sluice.yaml: file is empty`},
		{"null document", "---\n~\n", `sluice.yaml: file is empty`},
		{"two documents", "listen: ':1'\n---\nlisten: ':2'\n", `sluice.yaml:2: more than one YAML document in the file`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines := problemLines(t, tc.yaml)
			for _, l := range lines {
				if l == tc.want {
					return
				}
			}
			t.Errorf("no line\n%s\nin\n%s", tc.want, strings.Join(lines, "\n"))
		})
	}
}

func TestRedisSeeds(t *testing.T) {
	s, ok, err := ParseRedisSeeds("rediss://u:p@127.0.0.1:7000,127.0.0.1:7001, [::1]:7002")
	if !ok || err != nil || !s.TLS || s.User != "u" || s.Password != "p" || len(s.Addrs) != 3 || s.Addrs[2] != "[::1]:7002" {
		t.Fatalf("ParseRedisSeeds = %+v, %v, %v", s, ok, err)
	}
	if _, ok, _ := ParseRedisSeeds("redis://127.0.0.1:6379/0"); ok {
		t.Fatal("a single-server URL was taken for cluster seeds")
	}
	if _, err := Parse("sluice.yaml", []byte("redis: { url: \"127.0.0.1:7000,127.0.0.1:7001\" }\n"), noEnv); err != nil {
		t.Fatalf("bare seeds refused: %v", err)
	}
}

func TestLimitValidateReasons(t *testing.T) {
	// Whatever else limit.Limit.Validate refuses is reported with the rule, in its words.
	for _, period := range []string{"1500ns", "8000h"} {
		l := limit.Limit{Algorithm: limit.TokenBucket, Limit: 1 << 40, Period: mustDuration(t, period)}
		_, err := Parse("sluice.yaml", []byte("upstream: http://u\nrules: [{name: r, algorithm: token_bucket, limit: 1099511627776, period: "+period+"}]\n"), noEnv)
		want := l.Validate()
		switch {
		case want == nil && err != nil:
			t.Errorf("period %s: %v, but limit accepts it", period, err)
		case want != nil && (err == nil || err.Error() != `sluice.yaml: rules[0] "r": `+strings.TrimPrefix(want.Error(), "limit: ")):
			t.Errorf("period %s: got %v, want the rule and %q", period, err, want)
		}
	}
}

func mustDuration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestEveryProblemReported(t *testing.T) {
	lines := problemLines(t, `
upstream: http://127.0.0.1:9000
queues:
  - name: orders
    rate: fast
rules:
  - name: login
    algorithm: gcra
    limit: 5
    period: 0s
  - name: search
    algorithm: token_bucket
    limit: 1
    period: 1s
    on_limit: enqueue
    queue: missing
`)
	want := []string{
		`sluice.yaml: queues[0] "orders": rate: invalid rate "fast": want N/s, N/m, N/h or N/<duration>`,
		`sluice.yaml: rules[0] "login": period must be > 0`,
		`sluice.yaml: rules[1] "search": queue: no queue named "missing"`,
	}
	if !reflect.DeepEqual(lines, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}

func TestOneProblemPerField(t *testing.T) {
	// A value that fails to parse is not reported again as out of range, and decoding
	// problems do not stop the checks of the rest of the file.
	lines := problemLines(t, `
upstream: http://127.0.0.1:9000
rules:
  - {name: r, algorithm: gcra, limit: ten, period: soon, colour: red}
queues:
  - {name: q, rate: 1/s, max_depth: deep}
`)
	want := []string{
		`sluice.yaml:4: rules[0] "r": unknown field "colour"`,
		`sluice.yaml: queues[0] "q": max_depth: want an integer, got "deep"`,
		`sluice.yaml: rules[0] "r": limit: want an integer, got "ten"`,
		`sluice.yaml: rules[0] "r": period: invalid duration "soon": want a Go duration such as 500ms, 10s, 5m or 24h`,
	}
	if !reflect.DeepEqual(lines, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}

func TestParseRate(t *testing.T) {
	for _, tc := range []struct {
		in       string
		want     Rate
		interval time.Duration
		perSec   float64
		str      string
	}{
		{"50/s", Rate{50, time.Second}, 20 * time.Millisecond, 50, "50/s"},
		{"10/m", Rate{10, time.Minute}, 6 * time.Second, 10.0 / 60, "10/m"},
		{"3600/h", Rate{3600, time.Hour}, time.Second, 1, "3600/h"},
		{"5/2s", Rate{5, 2 * time.Second}, 400 * time.Millisecond, 2.5, "5/2s"},
		{"1/500ms", Rate{1, 500 * time.Millisecond}, 500 * time.Millisecond, 2, "1/500ms"},
		{" 7 / 1m ", Rate{7, time.Minute}, time.Minute / 7, 7.0 / 60, "7/m"},
		{"1000000000/s", Rate{1e9, time.Second}, time.Nanosecond, 1e9, "1000000000/s"},
	} {
		got, err := ParseRate(tc.in)
		if err != nil {
			t.Errorf("ParseRate(%q): %v", tc.in, err)
			continue
		}
		if got != tc.want || got.Interval() != tc.interval || got.PerSecond() != tc.perSec || got.String() != tc.str {
			t.Errorf("ParseRate(%q) = %+v, interval %v, %v/s, %q; want %+v, %v, %v/s, %q",
				tc.in, got, got.Interval(), got.PerSecond(), got.String(), tc.want, tc.interval, tc.perSec, tc.str)
		}
		// The text form round-trips.
		var back Rate
		if text, _ := got.MarshalText(); back.UnmarshalText(text) != nil || back != got {
			t.Errorf("round trip of %q gave %+v", tc.in, back)
		}
	}
	for in, why := range map[string]string{
		"fast": "want N/s, N/m, N/h or N/<duration>", "50": "want N/s, N/m, N/h or N/<duration>",
		"50/d": "want N/s, N/m, N/h or N/<duration>", "/s": "want N/s, N/m, N/h or N/<duration>",
		"1.5/s": "want N/s, N/m, N/h or N/<duration>", "0/s": "count must be > 0", "-3/s": "count must be > 0",
		"1/0s": "period must be > 0", "1/-1s": "period must be > 0", "2000000000/s": "faster than one per nanosecond",
		"99999999999999999999/s": "count out of range",
	} {
		_, err := ParseRate(in)
		if want := `invalid rate "` + in + `": ` + why; err == nil || err.Error() != want {
			t.Errorf("ParseRate(%q) error %v, want %s", in, err, want)
		}
	}
	if (Rate{}).Interval() != 0 || (Rate{}).PerSecond() != 0 {
		t.Errorf("zero Rate: interval %v, %v/s", Rate{}.Interval(), Rate{}.PerSecond())
	}
}

func TestMatch(t *testing.T) {
	for _, tc := range []struct {
		m            Match
		method, path string
		want         bool
	}{
		{Match{Path: "/api/orders"}, "GET", "/api/orders", true},
		{Match{Path: "/api/orders"}, "GET", "/api/orders/1", false},
		{Match{Path: "/api/orders"}, "GET", "/api/order", false},
		{Match{Path: "/api/*"}, "GET", "/api", true},
		{Match{Path: "/api/*"}, "GET", "/api/", true},
		{Match{Path: "/api/*"}, "GET", "/api/orders/1", true},
		{Match{Path: "/api/*"}, "GET", "/apix", false},
		{Match{Path: "/api/*"}, "GET", "/", false},
		{Match{Path: "/*"}, "DELETE", "/anything/at/all", true},
		{Match{Path: "/*"}, "GET", "/", true},
		{Match{}, "GET", "/x", true},
		{Match{Path: "/"}, "GET", "/", true},
		{Match{Path: "/"}, "GET", "/x", false},
		{Match{Methods: []string{"POST", "PUT"}, Path: "/*"}, "PUT", "/x", true},
		{Match{Methods: []string{"POST", "PUT"}, Path: "/*"}, "GET", "/x", false},
		{Match{Methods: []string{"POST"}, Path: "/*"}, "post", "/x", false},
		{Match{Methods: []string{"POST"}, Path: "/a/*"}, "POST", "/b", false},
		// What upstreams route alike is matched alike: HEAD under GET, a trailing slash.
		{Match{Methods: []string{"GET"}, Path: "/*"}, "HEAD", "/x", true},
		{Match{Methods: []string{"POST"}, Path: "/*"}, "HEAD", "/x", false},
		{Match{Path: "/api/orders"}, "GET", "/api/orders/", true},
		{Match{Path: "/api/orders/"}, "GET", "/api/orders", true},
		{Match{Path: "/API/Orders", CaseInsensitive: true}, "GET", "/api/orders/", true},
		{Match{Path: "/api/orders"}, "GET", "/api/orders//", false},
	} {
		if got := tc.m.Matches(tc.method, tc.path); got != tc.want {
			t.Errorf("%+v.Matches(%q, %q) = %v, want %v", tc.m, tc.method, tc.path, got, tc.want)
		}
	}

	// Methods from the file are upper-cased, and an absent match matches everything.
	c := mustParse(t, "upstream: http://u\nrules:\n  - {name: a, algorithm: gcra, limit: 1, period: 1s, match: {methods: [post, Get]}}\n  - {name: b, algorithm: gcra, limit: 1, period: 1s}\n")
	if m := c.Rules[0].Match; !reflect.DeepEqual(m.Methods, []string{"POST", "GET"}) || !m.Matches("GET", "/z") {
		t.Errorf("rules[0].Match = %+v", m)
	}
	if !c.Rules[1].Match.Matches("PATCH", "/deep/path") {
		t.Errorf("a rule without match does not match everything: %+v", c.Rules[1].Match)
	}
}

func TestKeyParts(t *testing.T) {
	c := mustParse(t, "upstream: http://u\nrules:\n  - {name: a, algorithm: gcra, limit: 1, period: 1s, key: [ip, 'header:x-api-key', 'query:Tenant', method, path, 'const:a:b c']}\n")
	want := []KeyPart{{KeyIP, ""}, {KeyHeader, "X-Api-Key"}, {KeyQuery, "Tenant"}, {KeyMethod, ""}, {KeyPath, ""}, {KeyConst, "a:b c"}}
	if got := c.Rules[0].Key; !reflect.DeepEqual(got, want) {
		t.Fatalf("key = %+v, want %+v", got, want)
	}
	var s []string
	for _, p := range c.Rules[0].Key {
		s = append(s, p.String())
	}
	if got := strings.Join(s, " "); got != "ip header:X-Api-Key query:Tenant method path const:a:b c" {
		t.Errorf("String() = %q", got)
	}
	// A single scalar stands for a list of one.
	c = mustParse(t, "upstream: http://u\nrules:\n  - {name: a, algorithm: gcra, limit: 1, period: 1s, key: 'header:X-Key'}\n")
	if got := c.Rules[0].Key; !reflect.DeepEqual(got, []KeyPart{{KeyHeader, "X-Key"}}) {
		t.Errorf("scalar key = %+v", got)
	}
}

func TestTrustedProxies(t *testing.T) {
	c := mustParse(t, "trusted_proxies: [10.1.2.3/8, 192.0.2.1, '2001:db8::1', '::ffff:10.0.0.1', '::ffff:10.0.0.0/104', 'fd00::/8']\n")
	var got []string
	for _, p := range c.TrustedProxies {
		got = append(got, p.String())
	}
	want := []string{"10.0.0.0/8", "192.0.2.1/32", "2001:db8::1/128", "10.0.0.1/32", "10.0.0.0/8", "fd00::/8"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("trusted_proxies = %v, want %v", got, want)
	}
	if lines := problemLines(t, "trusted_proxies: ['fe80::1%eth0']\n"); lines[0] != `sluice.yaml: trusted_proxies[0]: invalid CIDR or IP "fe80::1%eth0"` {
		t.Errorf("zoned address: %v", lines)
	}
}

// TestAdminAccess: admin_hosts items are normalised; a short admin token from the
// environment names its variable, and a token of 16 characters is accepted.
func TestAdminAccess(t *testing.T) {
	c := mustParse(t, "admin_token: 0123456789abcdef\nadmin_hosts: [Ops.Example, 'ops.example:9090', '::1', '[FD00::1]:9090', '::ffff:10.0.0.1', sluice-admin_1]\n")
	want := []string{"ops.example", "ops.example:9090", "[::1]", "[fd00::1]:9090", "10.0.0.1", "sluice-admin_1"}
	if !reflect.DeepEqual(c.AdminHosts, want) || c.AdminToken != "0123456789abcdef" {
		t.Errorf("admin_hosts = %q, token %q; want %q", c.AdminHosts, c.AdminToken, want)
	}
	_, err := Parse("sluice.yaml", []byte("data_dir: d\n"), func(k string) string {
		return map[string]string{EnvAdminToken: "abc"}[k]
	})
	if err == nil || err.Error() != "sluice.yaml: admin_token (from SLUICE_ADMIN_TOKEN) must be at least 16 characters long, got 3" {
		t.Errorf("short token from the environment: %v", err)
	}
}

func TestRuleHelpers(t *testing.T) {
	c := mustParse(t, `
upstream: http://u
on_store_error: deny
queues: [{name: q, rate: 1/s}]
rules:
  - {name: a, algorithm: token_bucket, limit: 10, period: 1s, burst: 20}
  - {name: b, algorithm: gcra, limit: 1, period: 1m, on_store_error: allow}
  - {name: c, action: enqueue, queue: q}
`)
	if got, want := c.Rules[0].LimitSpec(), (limit.Limit{Algorithm: limit.TokenBucket, Limit: 10, Period: time.Second, Burst: 20}); got != want {
		t.Errorf("LimitSpec = %+v, want %+v", got, want)
	}
	if got := c.Rules[0].StoreErrorMode(c.OnStoreError); got != StoreErrorDeny {
		t.Errorf("inherited mode = %q, want deny", got)
	}
	if got := c.Rules[1].StoreErrorMode(c.OnStoreError); got != StoreErrorAllow {
		t.Errorf("overridden mode = %q, want allow", got)
	}
	if got := (Rule{}).StoreErrorMode(""); got != StoreErrorAllow {
		t.Errorf("mode with no global = %q, want allow", got)
	}
	if !c.Rules[0].HasLimit() || c.Rules[2].HasLimit() {
		t.Errorf("HasLimit = %v, %v; want true, false", c.Rules[0].HasLimit(), c.Rules[2].HasLimit())
	}
	cc := mustParse(t, `
upstream: http://u
queues: [{name: q, rate: 1/s}]
rules:
  - {name: conns, key: [header:X-API-Key], algorithm: concurrency, limit: 4}
  - {name: slow, algorithm: concurrency, limit: 2, timeout: 5m, on_limit: enqueue, queue: q}
`)
	if r := cc.Rules[0]; !r.Concurrency() || !r.HasLimit() || r.Limit != 4 || r.Timeout != DefaultRuleTimeout || r.Period != 0 {
		t.Errorf("concurrency rule %+v; want limit 4, the default timeout, no period", r)
	}
	if r := cc.Rules[1]; !r.Concurrency() || r.Timeout != 5*time.Minute || r.OnLimit != OnLimitEnqueue {
		t.Errorf("concurrency rule with timeout and on_limit: enqueue: %+v", r)
	}
	if c.Rules[0].Concurrency() || c.Rules[0].Timeout != 0 {
		t.Errorf("token_bucket rule: Concurrency %v, Timeout %v", c.Rules[0].Concurrency(), c.Rules[0].Timeout)
	}
	q, ok := c.Queue("q")
	if !ok || q != &c.Queues[0] {
		t.Errorf("Queue(q) = %p, %v; want %p", q, ok, &c.Queues[0])
	}
	if q, ok := c.Queue("nope"); ok || q != nil {
		t.Errorf("Queue(nope) = %v, %v", q, ok)
	}
}

func TestErrorUnwraps(t *testing.T) {
	_, err := Parse("a.yaml", []byte("listen: x\nadmin_listen: y\n"), nil)
	var ce *Error
	if !errors.As(err, &ce) || len(ce.Problems) != 2 || ce.File != "a.yaml" {
		t.Fatalf("err = %#v", err)
	}
	if errors.Unwrap(err) != nil || len(ce.Unwrap()) != 2 {
		t.Errorf("Unwrap() = %v", ce.Unwrap())
	}
}

func TestNoServerImports(t *testing.T) {
	// The config package is shared by every command; it must not pull in the ingress's
	// HTTP framework or a queue client directly.
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			for _, banned := range []string{"labstack/echo", "nats-io/", "redis/go-redis"} {
				if strings.Contains(imp.Path.Value, banned) {
					t.Errorf("%s imports %s", name, imp.Path.Value)
				}
			}
		}
	}
}

func TestDefaultMinRate(t *testing.T) {
	for _, tc := range []struct{ rate, want Rate }{
		{Rate{500, time.Second}, Rate{500, 100 * time.Second}},
		{Rate{50, time.Second}, Rate{1, time.Second}},
		{Rate{1, 2 * time.Second}, Rate{1, 2 * time.Second}},
	} {
		if got := DefaultMinRate(tc.rate); got.PerSecond() != tc.want.PerSecond() {
			t.Errorf("DefaultMinRate(%v) = %v, want %v", tc.rate, got, tc.want)
		}
	}
}

func TestCosts(t *testing.T) {
	c := mustParse(t, `upstream: http://u
queues:
  - {name: llm, rate: 60/m, cost: 'json:/max_tokens', cost_rate: 20000/m, cost_burst: 500, cost_fallback: 2000, cost_from_response: 'json:/usage/total_tokens'}
  - {name: plain, rate: 1/s}
rules:
  - {name: tokens, algorithm: token_bucket, limit: 90000, period: 1m, cost: 'json:/max_tokens', cost_from_response: 'header:x-tokens-used'}
  - {name: bytes, algorithm: sliding_window, limit: 1000000, period: 1m, cost: body_bytes, cost_fallback: 4096}
  - {name: fixed, algorithm: gcra, limit: 10, period: 1s, cost: 3}
  - {name: counted, algorithm: gcra, limit: 10, period: 1s}
`)
	q := c.Queues[0]
	if q.Cost.String() != "json:/max_tokens" || q.CostRate != (Rate{N: 20000, Per: time.Minute}) ||
		q.CostBurst != 500 || q.CostFallback != 2000 || q.CostFromResponse.String() != "json:/usage/total_tokens" {
		t.Errorf("queue costs = %+v %+v %d %d %+v", q.Cost, q.CostRate, q.CostBurst, q.CostFallback, q.CostFromResponse)
	}
	if got := q.CostCapacity(); got != 20000 {
		t.Errorf("CostCapacity = %d, want 20000", got)
	}
	if p := c.Queues[1]; p.Cost.IsSet() || p.CostCapacity() != 0 {
		t.Errorf("a queue without costs has %+v, capacity %d", p.Cost, p.CostCapacity())
	}
	want := []struct {
		cost, resp string
		fallback   int64
	}{{"json:/max_tokens", "header:X-Tokens-Used", 90000}, {"body_bytes", "1", 4096}, {"3", "1", 10}, {"1", "1", 10}}
	for i, w := range want {
		r := c.Rules[i]
		if r.Cost.String() != w.cost || r.CostFromResponse.String() != w.resp {
			t.Errorf("rules[%d]: cost %q from response %q, want %q %q", i, r.Cost, r.CostFromResponse, w.cost, w.resp)
		}
		if got := Fallback(r.CostFallback, r.LimitSpec().Capacity()); got != w.fallback {
			t.Errorf("rules[%d]: fallback %d, want %d", i, got, w.fallback)
		}
	}
}

// TestBearerTenantValues: a tenant read from header:Authorization is named in weights and
// tenant_settings as the ingress reads it, the bearer scheme in any case: "bearer sk-1" in the
// file is the tenant "Bearer sk-1" (before, its weight applied to no request).
func TestBearerTenantValues(t *testing.T) {
	c := mustParse(t, `queues:
  - name: q
    rate: 1/s
    tenant: [header:Authorization, header:X-Region]
    fair: true
    weights: { "BEARER  sk-1\u0000eu": 3, plain: 2 }
    tenant_settings: { "bearer sk-2\u0000us": { label: two } }
`)
	q := c.Queues[0]
	if q.Weights["Bearer sk-1\x00eu"] != 3 || q.Weights["plain"] != 2 || q.TenantSettings["Bearer sk-2\x00us"].Label != "two" {
		t.Errorf("weights %v, tenant_settings %v: want the bearer scheme written Bearer", q.Weights, q.TenantSettings)
	}
}

// fair_by: units is kept on a fair queue with cost_rate; without fair_by the queue shares by
// jobs.
func TestFairBy(t *testing.T) {
	for _, c := range []struct {
		yaml string
		want FairBy
	}{
		{"{name: q, rate: 1/s, tenant: [ip], fair: true, cost_rate: 100/s, fair_by: units}", FairByUnits},
		{"{name: q, rate: 1/s, tenant: [ip], fair: true, fair_by: jobs}", FairByJobs},
		{"{name: q, rate: 1/s, tenant: [ip], fair: true, cost_rate: 100/s}", ""},
	} {
		cfg, err := Parse("sluice.yaml", []byte("upstream: http://u\nqueues: ["+c.yaml+"]\n"), nil)
		if err != nil {
			t.Fatalf("%s: %v", c.yaml, err)
		}
		if got := cfg.Queues[0].FairBy; got != c.want {
			t.Errorf("%s: FairBy %q, want %q", c.yaml, got, c.want)
		}
	}
}
