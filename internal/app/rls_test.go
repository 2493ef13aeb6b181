package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// TestIngressServesRLS: with rls_listen the ingress answers ShouldRateLimit from its domain
// files, counting in its Redis, with a Sluice rule behind a descriptor, and counts the rule's
// decisions in the same sluice_decisions_total as the HTTP path.
func TestIngressServesRLS(t *testing.T) {
	rds := testenv.Redis(t)
	dir := t.TempDir()
	domains := filepath.Join(dir, "ratelimit")
	if err := os.Mkdir(domains, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(domains, "api.yaml"), []byte(`domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: api_key
    rule: per-key
`), 0o644); err != nil {
		t.Fatal(err)
	}
	rlsAddr, listen, admin := freeAddr(t), freeAddr(t), freeAddr(t)
	cfg := func(rules string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
data_dir: %s
upstream: http://127.0.0.1:1
redis: {url: %s}
store_timeout: 2s # a loaded machine's slow Redis call must not fail open here: the limits have to bind
rules:
%s
rls_listen: %s
rls: {config_dir: %s}
`, listen, admin, filepath.Join(dir, "data"), rds.URL(), rules, rlsAddr, domains)
	}
	perKey := `  - name: per-key
    match: {path: /never/*}
    algorithm: gcra
    limit: 5
    period: 1h`
	in := start(t, dir, cfg(perKey))

	conn, err := grpc.NewClient(rlsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	ask := func(d *rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		return resp
	}
	ip := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}}}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := ask(ip).OverallCode; got != want {
			t.Fatalf("call %d: %v, want %v", i+1, got, want)
		}
	}
	key := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "api_key", Value: "k1"}}, HitsAddend: wrapperspb.UInt64(5)}
	if resp := ask(key); resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("weighted call on the gcra rule: %v", resp)
	}
	if resp := ask(key); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].DurationUntilReset.AsDuration() <= 0 {
		t.Fatalf("over the gcra rule: %v", resp)
	}
	if n, err := rds.Client.Keys(context.Background(), "*rls:api*").Result(); err != nil || len(n) == 0 {
		t.Fatalf("no rls counters in the ingress's Redis: %v %v", n, err)
	}
	metrics := func() string { return getText(t, "http://"+in.admin+"/metrics") }
	body := metrics()
	for _, want := range []string{`sluice_decisions_total{outcome="rejected",rule="per-key"} 1`, `sluice_decisions_total{outcome="rejected",rule="rls:api.remote_address"} 1`} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	// The watcher reloads a changed domain file.
	if err := os.WriteFile(filepath.Join(domains, "api.yaml"), []byte(`domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: day, requests_per_unit: 7}
  - key: api_key
    rule: per-key
`), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the changed domain file to apply", func() bool {
		return ask(ip).Statuses[0].CurrentLimit.GetRequestsPerUnit() == 7
	})
	// A config reload that drops the rule a descriptor names is refused; the rule stays.
	if err := os.WriteFile(filepath.Join(dir, "sluice.yaml"), []byte(cfg(`  - name: other
    algorithm: gcra
    limit: 5
    period: 1h`)), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the refused reload to be counted", func() bool {
		return strings.Contains(metrics(), "sluice_config_reload_errors_total 1")
	})
	if resp := ask(key); resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 5 || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("after the refused reload: %v", resp)
	}
}
