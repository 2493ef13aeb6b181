package rls

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
)

// TestBadDomainFiles: every problem names the file and the field; all of a file's problems
// are reported at once.
func TestBadDomainFiles(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cases := []struct {
		name, text string
		want       []string
	}{
		{"unknown-field.yaml", "domain: d\ndescriptors:\n  - key: a\n    rate_limt: {unit: second, requests_per_unit: 1}\n",
			[]string{`unknown-field.yaml:4: unknown field "rate_limt"`}},
		{"no-domain.yaml", "descriptors: []\n", []string{"no-domain.yaml", "domain: required"}},
		{"bad-unit.yaml", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
			[]string{"bad-unit.yaml", `descriptors[0].rate_limit.unit: invalid unit "fortnight"`}},
		{"no-rpu.yaml", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: second}\n",
			[]string{"no-rpu.yaml", "descriptors[0].descriptors[0].rate_limit.requests_per_unit: required"}},
		{"unlimited-unit.yaml", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n",
			[]string{"unlimited-unit.yaml", "descriptors[0].rate_limit.unlimited"}},
		{"dup.yaml", "domain: d\ndescriptors:\n  - key: a\n    value: v\n  - key: a\n    value: v\n",
			[]string{"dup.yaml", `descriptors[1]: duplicate descriptor "a_v"`}},
		{"no-key.yaml", "domain: d\ndescriptors:\n  - value: v\n", []string{"no-key.yaml", "descriptors[0].key: required"}},
		{"no-rule.yaml", "domain: d\ndescriptors:\n  - key: a\n    rule: nope\n", []string{"no-rule.yaml", `descriptors[0].rule: no rule "nope"`}},
		{"conc-rule.yaml", "domain: d\ndescriptors:\n  - key: a\n    rule: conns\n", []string{"conc-rule.yaml", "descriptors[0].rule", "concurrency"}},
		{"both.yaml", "domain: d\ndescriptors:\n  - key: a\n    rule: tokens-per-key\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			[]string{"both.yaml", "descriptors[0].rule: a descriptor takes rule or a rate_limit"}},
		{"empty.yaml", "", []string{"empty.yaml", "empty file"}},
		{"wrong-type.yaml", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: many}\n",
			[]string{"wrong-type.yaml: line 4", "many"}},
	}
	for _, c := range cases {
		_, err := Compile(map[string][]byte{c.name: []byte(c.text)}, cfg)
		if err == nil {
			t.Errorf("%s: compiled", c.name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not say %q", c.name, err, w)
			}
		}
	}
	_, err := Compile(map[string][]byte{
		"a.yaml": []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n"),
		"b.yaml": []byte("domain: d\ndescriptors: []\n"),
	}, cfg)
	if err == nil || !strings.Contains(err.Error(), `b.yaml: domain "d": domain: duplicate domain "d" (also in a.yaml)`) {
		t.Errorf("duplicate domain: %v", err)
	}
	if _, err := New(testConfig(t, filepath.Join(t.TempDir(), "missing")), Options{}); err == nil || !strings.Contains(err.Error(), "config_dir") {
		t.Errorf("missing config_dir: %v", err)
	}
}

// TestReloadKeepsOldOnError: a directory that stops compiling leaves the domains in force; a
// fixed one replaces them, whether Reload is called or the directory is watched.
func TestReloadKeepsOldOnError(t *testing.T) {
	b := start(t, map[string]string{"d.yaml": "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"})
	limitOf := func() uint32 {
		return b.ask(t, "d", 0, desc("a", "x")).Statuses[0].CurrentLimit.GetRequestsPerUnit()
	}
	if got := limitOf(); got != 5 {
		t.Fatalf("limit %d, want 5", got)
	}
	writeDomains(t, b.dir, map[string]string{"d.yaml": "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: -1}\n"})
	if err := b.srv.Reload(); err == nil || !strings.Contains(err.Error(), "d.yaml") || !strings.Contains(err.Error(), "requests_per_unit") {
		t.Fatalf("Reload of a bad file: %v", err)
	}
	if got := limitOf(); got != 5 {
		t.Fatalf("after a bad reload: limit %d, want the old 5", got)
	}

	ctx, cancel := context.WithCancel(context.Background())
	reloaded := make(chan error, 8)
	watching := make(chan error, 1)
	go func() { watching <- b.srv.Watch(ctx, 10*time.Millisecond, func(err error) { reloaded <- err }) }()
	t.Cleanup(func() { cancel(); <-watching })
	// The watch may start after the first write: write until a reload is seen.
	deadline := time.After(10 * time.Second)
	for {
		writeDomains(t, b.dir, map[string]string{"d.yaml": "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 7}\n"})
		select {
		case err := <-reloaded:
			if err != nil {
				t.Fatalf("watched reload: %v", err)
			}
		case <-time.After(200 * time.Millisecond):
			continue
		case <-deadline:
			t.Fatal("no reload within 10s of the change")
		}
		break
	}
	if got := limitOf(); got != 7 {
		t.Fatalf("after a good reload: limit %d, want 7", got)
	}
	// A rule a descriptor uses cannot vanish with a config reload.
	if err := b.srv.SetConfig(testConfigWithout(t, b.dir)); err != nil {
		t.Fatalf("SetConfig with no rule in use: %v", err)
	}
}

// testConfigWithout is a config with no rules.
func testConfigWithout(t *testing.T, dir string) *config.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(path, []byte("rls_listen: 127.0.0.1:0\nrls: {config_dir: "+dir+"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestRuleCannotVanish: a config reload that drops a rule a descriptor names is refused.
func TestRuleCannotVanish(t *testing.T) {
	b := start(t, map[string]string{"d.yaml": conformanceDomain})
	err := b.srv.SetConfig(testConfigWithout(t, b.dir))
	if err == nil || !strings.Contains(err.Error(), "d.yaml: descriptors[") || !strings.Contains(err.Error(), `no rule "tokens-per-key"`) {
		t.Fatalf("SetConfig without the rule: %v", err)
	}
	if got := b.ask(t, "test-domain", 0, desc("tokens", "k")).Statuses[0].CurrentLimit.GetRequestsPerUnit(); got != 10 {
		t.Fatalf("after the refused config: limit %d, want the rule's 10", got)
	}
}

// TestHealthAndNoReflection: the health service answers SERVING, reflection is off by
// default, and a request without a domain is InvalidArgument.
func TestHealthAndNoReflection(t *testing.T) {
	b := start(t, map[string]string{"d.yaml": "domain: d\n"})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, svc := range []string{"", rlsv3.RateLimitService_ServiceDesc.ServiceName} {
		r, err := healthpb.NewHealthClient(b.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q: %v %v", svc, r, err)
		}
	}
	st, err := reflectionpb.NewServerReflectionClient(b.conn).ServerReflectionInfo(ctx)
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("reflection: %v, want Unimplemented", err)
	}
	_, err = b.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Descriptors: ds(desc("a", "b"))})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("no domain: %v", err)
	}
	if resp := b.ask(t, "other", 0, desc("a", "b")); resp.OverallCode != ok || resp.Statuses[0].CurrentLimit != nil {
		t.Errorf("unknown domain: %v", resp)
	}
}

// TestStoreDown: with Redis down, each descriptor follows its on_store_error: a rule that
// fails open is decided in-process (and still limited there), the others are OVER_LIMIT; no
// call is an RPC error.
func TestStoreDown(t *testing.T) {
	b := start(t, map[string]string{"d.yaml": `domain: d
descriptors:
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: open
    rule: open
  - key: closed
    rule: tokens-per-key
`})
	b.redis.Stop()
	resp := b.ask(t, "d", 0, desc("plain", "x"), desc("open", "x"), desc("closed", "x"))
	if resp.OverallCode != over || resp.Statuses[0].Code != over || resp.Statuses[1].Code != ok || resp.Statuses[2].Code != over {
		t.Fatalf("with the store down: %v", resp)
	}
	if resp := b.ask(t, "d", 0, desc("open", "x")); resp.Statuses[0].Code != over {
		t.Fatalf("the fail-open rule is still limited in-process (1 per hour): %v", resp)
	}
	for rule, outcome := range map[string]string{"open": "fail_open", "tokens-per-key": "fail_closed", "rls:d.plain": "fail_closed"} {
		if got := testenv.Metric(t, b.reg, "sluice_decisions_total", "rule", rule, "outcome", outcome); got < 1 {
			t.Errorf("sluice_decisions_total{rule=%s,outcome=%s} = %v", rule, outcome, got)
		}
	}
}

// TestCurrentLimitFollowsTheRule: the current_limit an answer states is built once per policy
// and reused, so it must follow a reload that changes the rule behind a descriptor, and a
// descriptor's own limit (override, no name) must not leak into the policy's answers.
func TestCurrentLimitFollowsTheRule(t *testing.T) {
	b := start(t, map[string]string{"d.yaml": "domain: d\ndescriptors:\n  - key: k\n    rule: tokens-per-key\n    rate_limit: {name: named}\n"})
	limitOf := func(ds *rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse_RateLimit {
		return b.ask(t, "d", 0, ds).Statuses[0].CurrentLimit
	}
	if got := limitOf(desc("k", "a")); got.GetRequestsPerUnit() != 10 || got.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || got.GetName() != "named" {
		t.Fatalf("current_limit %v, want 10 per minute named", got)
	}
	o := desc("k", "a")
	o.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_HOUR}
	if got := limitOf(o); got.GetRequestsPerUnit() != 3 || got.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR || got.GetName() != "" {
		t.Fatalf("override: current_limit %v, want 3 per hour, no name", got)
	}
	if got := limitOf(desc("k", "a")); got.GetRequestsPerUnit() != 10 || got.GetName() != "named" {
		t.Fatalf("after an override: current_limit %v, want 10 named", got)
	}
	next := *b.srv.cfg.Load()
	next.Rules = slices.Clone(next.Rules)
	i := slices.IndexFunc(next.Rules, func(r config.Rule) bool { return r.Name == "tokens-per-key" })
	next.Rules[i].Limit, next.Rules[i].Period = 20, 2*time.Hour
	if err := b.srv.SetConfig(&next); err != nil {
		t.Fatal(err)
	}
	if got := limitOf(desc("k", "a")); got.GetRequestsPerUnit() != 20 || got.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR || got.GetUnitMultiplier().GetValue() != 2 {
		t.Fatalf("after the rule changed: current_limit %v, want 20 per 2 hours", got)
	}
}

// TestCallerGoneIsNotAStoreError: a call whose caller went away before the store answered
// (Envoy's timeout, a client that closed the stream: what ended each ghz run in
// scripts/bench-rls.sh) is counted in sluice_rls_abandoned_total, not as a store error; a
// store that is down still is one.
func TestCallerGoneIsNotAStoreError(t *testing.T) {
	b := start(t, map[string]string{"d.yaml": `domain: d
descriptors:
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
`})
	req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{desc("plain", "x"), desc("plain", "y")}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.srv.ShouldRateLimit(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := testenv.Metric(t, b.reg, "sluice_rls_store_errors_total"); got != 0 {
		t.Errorf("a cancelled caller counted %v store errors, want 0", got)
	}
	if got := testenv.Metric(t, b.reg, "sluice_rls_abandoned_total"); got != 1 {
		t.Errorf("sluice_rls_abandoned_total = %v after a cancelled call, want 1", got)
	}
	b.redis.Stop()
	b.ask(t, "d", 0, desc("plain", "x"))
	if got := testenv.Metric(t, b.reg, "sluice_rls_store_errors_total"); got != 1 {
		t.Errorf("sluice_rls_store_errors_total = %v with the store down, want 1", got)
	}
}
