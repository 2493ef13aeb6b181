package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-rl/sluice/internal/admin"
	"github.com/sluice-rl/sluice/internal/regions"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
	"github.com/sluice-rl/sluice/queue"
)

// A worker whose config names its region renews the lease of its global queue on the
// coordinator named in regions, and delivers; on cancel it closes that connection too
// (goleak checks at the end).
func TestWorkerRegionLease(t *testing.T) {
	rs, ns, coord := testenv.Redis(t), testenv.NATS(t), testenv.NATS(t)
	up := workertest.NewRecorder(t)
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	yaml := fmt.Sprintf(`region: eu
regions: {names: [eu, us], coordinator: %q, lease: 1s, renew: 250ms}
admin_listen: 127.0.0.1:%d
redis: { url: %q }
nats: { url: %q }
shutdown_timeout: 2s
queues:
  - {name: main, rate: 100/s, global: true, target: POST %s/main}
`, coord.URL, testenv.FreePort(t), rs.URL(), ns.URL, up.URL)
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(testenv.Connect(t, ns.URL))
	if err != nil {
		t.Fatal(err)
	}
	qs, err := queue.New(context.Background(), js, queue.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Provisioned before the worker starts: a stream updated to other settings while the worker
	// creates its consumer on it races inside nats-server (its race detector says so).
	if err := qs.Provision(context.Background(), []queue.Spec{{Name: "main"}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Worker{ConfigPath: path}.Run(ctx) }()

	ids := workertest.Publish(t, qs, "main", 20, true)
	up.WaitCount(t, 15*time.Second, "the jobs", func(n int) bool { return n >= len(ids) })

	cjs, err := jetstream.New(testenv.Connect(t, coord.URL))
	if err != nil {
		t.Fatal(err)
	}
	var lease regions.Lease
	testenv.WaitFor(t, 10*time.Second, "eu's lease of main on the coordinator", func() bool {
		kv, err := cjs.KeyValue(context.Background(), regions.Bucket)
		if err != nil {
			return false
		}
		e, err := kv.Get(context.Background(), "main")
		if err != nil {
			return false
		}
		var rec regions.Record
		if json.Unmarshal(e.Value(), &rec) != nil {
			return false
		}
		lease = rec.Leases["eu"]
		return lease.Share > 0 && rec.Budget == 100
	})
	if lease.Share > 100 || !lease.Expires.After(time.Now().Add(-time.Second)) {
		t.Errorf("eu's lease %+v; want a share of at most the budget, renewed", lease)
	}
	// The region's ingress shows the lease on its admin listener: GET /v1/regions.
	ing := start(t, t.TempDir(), strings.Replace(yaml, "admin_listen:", "listen: "+freeAddr(t)+"\nadmin_listen: "+freeAddr(t)+"\n#", 1))
	var st admin.RegionsStatus
	testenv.WaitFor(t, 10*time.Second, "eu's lease in GET /v1/regions", func() bool {
		res, err := http.Get("http://" + ing.admin + "/v1/regions")
		if err != nil {
			return false
		}
		defer res.Body.Close()
		st = admin.RegionsStatus{}
		return json.NewDecoder(res.Body).Decode(&st) == nil && len(st.Queues) == 1 && len(st.Queues[0].Leases) == 2 &&
			st.Queues[0].Leases[0].Share > 0
	})
	if q := st.Queues[0]; st.Region != "eu" || st.Coordinator != "ok" || q.Queue != "main" || q.Budget != 100 || q.SafeShare != 50 ||
		q.Leases[0].Region != "eu" || q.Leases[0].OnSafeShare || q.Leases[1].Region != "us" || !q.Leases[1].OnSafeShare {
		t.Errorf("GET /v1/regions: %+v", st)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after cancel = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of cancel")
	}
}

// TestIngressGlobalRule: an ingress of region a with a rule whose limit is global (20 per
// second per key) decides each key against its region's share of the limit: while region b
// (a coordinator renewing for it, with more demand than the budget) holds its half, a's
// ingress admits 10 of a burst of one key's requests and says X-RateLimit-Limit: 10; once b
// stops renewing and its lease expired, a takes the whole limit again.
func TestIngressGlobalRule(t *testing.T) {
	coord := testenv.NATS(t)
	up := workertest.NewRecorder(t)
	dir := t.TempDir()
	rlsAddr := freeAddr(t)
	r := start(t, dir, fmt.Sprintf(`listen: %s
admin_listen: %s
data_dir: %s
upstream: %s
region: a
regions: {names: [a, b], coordinator: %q, lease: 1s, renew: 250ms}
rules:
  - {name: per-key, key: [header:X-Key], algorithm: token_bucket, limit: 20, period: 1s, global: true}
rls_listen: %s
rls: {config_dir: %s}
`, freeAddr(t), freeAddr(t), filepath.Join(dir, "data"), up.URL, coord.URL, rlsAddr, rlsDomain(t, dir)))
	ask := rlsClient(t, rlsAddr)
	cjs, err := jetstream.New(testenv.Connect(t, coord.URL))
	if err != nil {
		t.Fatal(err)
	}
	// Region b renews with a demand above the budget until told to stop.
	bctx, stopB := context.WithCancel(context.Background())
	defer stopB()
	b := regions.NewCoordinator(cjs, "b", nil)
	terms := regions.Terms{Budget: 20, Lease: time.Second, Renew: 250 * time.Millisecond, Lingers: 500 * time.Millisecond}
	bDone := make(chan struct{})
	go func() {
		defer close(bDone)
		for bctx.Err() == nil {
			_, _, _ = b.Renew(bctx, "rule.per-key", 1000, terms, nil)
			select {
			case <-bctx.Done():
			case <-time.After(terms.Renew):
			}
		}
	}()
	// burst sends n requests of one key at once and returns how many were admitted, and the
	// X-RateLimit-Limit of the last answer.
	key := 0
	burst := func(n int) (int, string) {
		key++
		admitted, limit := 0, ""
		for range n {
			req, _ := http.NewRequest("GET", "http://"+r.listen+"/api", nil)
			req.Header.Set("X-Key", fmt.Sprint("k", key))
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				admitted++
			}
			limit = res.Header.Get("X-Ratelimit-Limit")
		}
		return admitted, limit
	}
	share := func(region string) float64 {
		rec, _, err := regions.Read(context.Background(), cjs, "rule.per-key")
		if err != nil {
			return -1
		}
		if !time.Now().Before(rec.Leases[region].Expires) {
			return -1
		}
		return rec.Leases[region].Share
	}
	// Past the fresh record's hold: a's ingress, with requests (demand), and b at 10 each.
	testenv.WaitFor(t, 10*time.Second, "a and b at 10 each", func() bool {
		burst(1)
		return share("a") == 10 && share("b") == 10
	})
	// The ingress shows its lease of the rule in its metrics, as the workers show theirs.
	if got := metricLines(t, r.admin, `{rule="per-key"}`); got["sluice_region_rule_share"] != "10" ||
		got["sluice_region_rule_on_safe_share"] != "0" || got["sluice_region_rule_lease_lost"] != "0" {
		t.Errorf("the rule's lease in the metrics: %v; want share 10, on_safe_share 0, lease_lost 0", got)
	}
	// The region's part is 10 a second with a burst of 10: 10 at once, and what it refilled
	// while the 30 were sent (a loaded machine sends them slower).
	most := func(start time.Time) int { return 10 + int(10*time.Since(start).Seconds()) + 1 }
	start := time.Now()
	admitted, limit := burst(30)
	t.Logf("b holding its half: %d of 30 admitted in %v, X-RateLimit-Limit %s", admitted, time.Since(start), limit)
	if bound := most(start); admitted < 10 || admitted > bound || limit != "10" {
		t.Errorf("with b holding half the limit: %d of 30 admitted, X-RateLimit-Limit %q; want 10 and what refilled (at most %d), 10", admitted, limit, bound)
	}
	// The Envoy rate-limit service decides the rule behind a descriptor against the same share.
	admitted, limit, start = 0, "", time.Now()
	for range 30 {
		st := ask("rls-k1")
		if st.Code == rlsv3.RateLimitResponse_OK {
			admitted++
		}
		limit = fmt.Sprint(st.CurrentLimit.GetRequestsPerUnit())
	}
	t.Logf("ShouldRateLimit, b holding its half: %d of 30 admitted, current_limit %s", admitted, limit)
	if bound := most(start); admitted < 10 || admitted > bound || limit != "10" {
		t.Errorf("ShouldRateLimit with b holding half the limit: %d of 30 admitted, current_limit %s; want 10 and what refilled (at most %d), 10", admitted, limit, bound)
	}
	stopB()
	<-bDone
	testenv.WaitFor(t, 10*time.Second, "a at the whole limit", func() bool {
		_, limit := burst(1)
		return limit == "20"
	})
	if admitted, _ := burst(30); admitted < 20 || admitted > 21 {
		t.Errorf("a alone: %d of 30 admitted; want 20", admitted)
	}
}

// rlsDomain writes a domain file under dir that puts the rule per-key behind the descriptor
// api_key, and returns its directory.
func rlsDomain(t *testing.T, dir string) string {
	t.Helper()
	domains := filepath.Join(dir, "ratelimit")
	if err := os.Mkdir(domains, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(domains, "api.yaml"), []byte("domain: api\ndescriptors:\n  - {key: api_key, rule: per-key}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return domains
}

// rlsClient returns a function that asks the rate-limit service at addr, through a real gRPC
// client, about one api_key descriptor of the domain api, and returns its status.
func rlsClient(t *testing.T, addr string) func(key string) *rlsv3.RateLimitResponse_DescriptorStatus {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := rlsv3.NewRateLimitServiceClient(conn)
	return func(key string) *rlsv3.RateLimitResponse_DescriptorStatus {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api",
			Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "api_key", Value: key}}}}})
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		return resp.Statuses[0]
	}
}

// TestIngressGlobalRuleStrict: a region cut off from the coordinator (nothing listens there)
// with a strict budget (safe_share: 0) admits nothing of a global rule, on the HTTP path (429,
// X-RateLimit-Limit: 0, Retry-After of at most a renewal) and through the Envoy rate-limit
// service (OVER_LIMIT, current_limit 0); a rule that is not global admits as ever.
func TestIngressGlobalRuleStrict(t *testing.T) {
	up := workertest.NewRecorder(t)
	dir := t.TempDir()
	rlsAddr := freeAddr(t)
	r := start(t, dir, fmt.Sprintf(`listen: %s
admin_listen: %s
data_dir: %s
upstream: %s
region: a
regions: {names: [a, b], coordinator: "nats://%s", lease: 1s, renew: 250ms, safe_share: 0}
rules:
  - {name: per-key, match: {path: /api/*}, key: [header:X-Key], algorithm: gcra, limit: 20, period: 1s, global: true}
  - {name: local, match: {path: /local/*}, key: [header:X-Key], algorithm: gcra, limit: 20, period: 1s}
rls_listen: %s
rls: {config_dir: %s}
`, freeAddr(t), freeAddr(t), filepath.Join(dir, "data"), up.URL, freeAddr(t), rlsAddr, rlsDomain(t, dir)))
	ask := rlsClient(t, rlsAddr)
	get := func(path string) *http.Response {
		req, _ := http.NewRequest("GET", "http://"+r.listen+path, nil)
		req.Header.Set("X-Key", "k1")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res
	}
	for i := range 10 {
		res := get("/api/x")
		if res.StatusCode != http.StatusTooManyRequests || res.Header.Get("X-Ratelimit-Limit") != "0" || res.Header.Get("Retry-After") != "1" {
			t.Fatalf("request %d on the global rule, cut off with safe_share 0: %d, X-RateLimit-Limit %q, Retry-After %q; want 429, 0, 1",
				i+1, res.StatusCode, res.Header.Get("X-Ratelimit-Limit"), res.Header.Get("Retry-After"))
		}
		if st := ask("k1"); st.Code != rlsv3.RateLimitResponse_OVER_LIMIT || st.CurrentLimit.GetRequestsPerUnit() != 0 {
			t.Fatalf("call %d of ShouldRateLimit: %v, current_limit %d; want OVER_LIMIT, 0", i+1, st.Code, st.CurrentLimit.GetRequestsPerUnit())
		}
	}
	if res := get("/local/x"); res.StatusCode != http.StatusOK {
		t.Errorf("the rule that is not global: %d, want 200", res.StatusCode)
	}
	if n := up.Count(); n != 1 {
		t.Errorf("the upstream saw %d requests, want 1 (the local rule's)", n)
	}
	// Cut off from the start: the metrics say the safe share (0) applies, and once that lasted
	// a lease and a renew period (1.25 s) the alert rises, beside the failed renewals.
	testenv.WaitFor(t, 10*time.Second, "the rule's lease lost in the metrics", func() bool {
		got := metricLines(t, r.admin, `{rule="per-key"}`)
		return got["sluice_region_rule_lease_lost"] == "1"
	})
	got := metricLines(t, r.admin, `{rule="per-key"}`)
	if got["sluice_region_rule_share"] != "0" || got["sluice_region_rule_on_safe_share"] != "1" ||
		got["sluice_region_rule_renewal_failures_total"] == "0" || got["sluice_region_rule_lease_expiry_timestamp_seconds"] != "0" {
		t.Errorf("the rule's lease in the metrics, cut off: %v; want share 0, on_safe_share 1, failures above 0, no expiry", got)
	}
	if _, ok := metricLines(t, r.admin, `{rule="local"}`)["sluice_region_rule_share"]; ok {
		t.Error("the rule that is not global has a lease in the metrics")
	}
}

// metricLines scrapes the admin listener's /metrics and returns the values of the
// sluice_region_rule_* samples whose labels are labels, by metric name.
func metricLines(t *testing.T, admin, labels string) map[string]string {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := map[string]string{}
	for line := range strings.SplitSeq(string(b), "\n") {
		name, rest, ok := strings.Cut(line, labels+" ")
		if ok && strings.HasPrefix(name, "sluice_region_rule_") {
			out[name] = rest
		}
	}
	return out
}
