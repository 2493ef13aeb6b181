package app

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// What the upstream receives as Idempotency-Key is unique per tenant and stable across one
// client's retries: two tenants' direct jobs with the same client key arrive under two keys;
// one client's request forwarded (under its rule's burst) and then, on its retry, deferred
// (over it) arrives both times under one key, which is neither tenant's bare key.
func TestUpstreamIdempotencyKeyPerTenant(t *testing.T) {
	dir := t.TempDir()
	rec := workertest.NewRecorder(t)
	r := start(t, dir, fmt.Sprintf(`listen: %s
admin_listen: %s
data_dir: %s
upstream: %s
queues:
  - name: orders
    rate: 50/s
    tenant: [header:X-API-Key]
    fair: true
    pause_scope: tenant
    tenant_max_depth: 100
    target: POST %s/jobs
rules:
  - name: orders-per-key
    match: { methods: [POST], path: /api/orders }
    key: [header:X-API-Key]
    algorithm: token_bucket
    limit: 1
    period: 1h
    burst: 1
    on_limit: enqueue
    queue: orders
`, freeAddr(t), freeAddr(t), filepath.Join(dir, "data"), rec.URL, rec.URL))

	send := func(path, apiKey, idemKey, body string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+r.listen+path, strings.NewReader(body))
		req.Header.Set("X-API-Key", apiKey)
		req.Header.Set("Idempotency-Key", idemKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// Two tenants, one client key, direct jobs.
	for _, tenant := range []string{"alice", "bob"} {
		if code := send("/v1/queues/orders/jobs", tenant, "shared-25928", tenant); code != http.StatusAccepted {
			t.Fatalf("%s's job: %d, want 202", tenant, code)
		}
	}
	// One client's request: forwarded (its burst), then its retry deferred (over the limit).
	if code := send("/api/orders", "carol", "order-7", "carol"); code != http.StatusOK {
		t.Fatalf("carol's first try: %d, want 200 (forwarded)", code)
	}
	if code := send("/api/orders", "carol", "order-7", "carol"); code != http.StatusAccepted {
		t.Fatalf("carol's retry: %d, want 202 (deferred)", code)
	}
	rec.WaitCount(t, 30*time.Second, "every delivery", func(n int) bool { return n >= 4 })
	keys := map[string][]string{}
	for _, a := range rec.Arrivals() {
		keys[string(a.Body)] = append(keys[string(a.Body)], a.Header.Get("Idempotency-Key"))
	}
	t.Logf("upstream keys: %v", keys)
	alice, bob := keys["alice"], keys["bob"]
	if len(alice) != 1 || len(bob) != 1 || alice[0] == bob[0] {
		t.Errorf("two tenants' jobs with one client key reached the upstream under %v and %v, want two keys", alice, bob)
	}
	for _, k := range append(alice, bob...) {
		if k == "shared-25928" || !strings.HasSuffix(k, ":shared-25928") {
			t.Errorf("a tenant's key reached the upstream as %q, want <tenant id>:shared-25928", k)
		}
	}
	carol := keys["carol"]
	if len(carol) != 2 || carol[0] != carol[1] || carol[0] == "order-7" {
		t.Errorf("one client's forwarded request and deferred retry reached the upstream under %v, want one tenant-scoped key twice", carol)
	}
}
