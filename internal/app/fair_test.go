package app

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// A fair queue through the ingress: jobs submitted directly and requests deferred by a rule
// (action: enqueue) land in their tenant's backlog, the tenant taken from the original request;
// the operating API shows the tenants, their depths and delivered counts, and the metric
// sluice_queue_tenants counts them.
func TestFairQueueThroughTheIngress(t *testing.T) {
	dir := t.TempDir()
	rec := workertest.NewRecorder(t)
	r := start(t, dir, fmt.Sprintf(`listen: %s
admin_listen: %s
data_dir: %s
upstream: %s
rules:
  - name: orders
    match: { methods: [POST], path: /orders }
    action: enqueue
    queue: shared
queues:
  - name: shared
    rate: 1/h
    tenant: header:X-Tenant
    fair: true
    weights: { gold: 3 }
    tenant_settings: { gold: { label: gold-co } }
    target: POST %s/jobs
`, freeAddr(t), freeAddr(t), filepath.Join(dir, "data"), rec.URL, rec.URL))

	post := func(path, tenant string) string {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+r.listen+path, strings.NewReader("x"))
		req.Header.Set("X-Tenant", tenant)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("POST %s: %d", path, resp.StatusCode)
		}
		return strings.TrimPrefix(resp.Header.Get("Location"), "/v1/jobs/")
	}
	for range 5 {
		post("/v1/queues/shared/jobs", "gold")
	}
	var deferred []string
	for range 3 {
		deferred = append(deferred, post("/orders", "plain"))
	}

	// The deferred job belongs to the tenant of the request that was deferred.
	getJob := func(id, tenant string) int {
		req, _ := http.NewRequest(http.MethodGet, "http://"+r.listen+"/v1/jobs/"+id, nil)
		req.Header.Set("X-Tenant", tenant)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := getJob(deferred[0], "plain"); got != http.StatusOK {
		t.Errorf("the deferred job, asked by its tenant: %d, want 200", got)
	}
	if got := getJob(deferred[0], "gold"); got != http.StatusNotFound {
		t.Errorf("the deferred job, asked by another tenant: %d, want 404", got)
	}

	admin := "http://" + r.admin
	var qs struct {
		Depth      uint64 `json:"depth"`
		Fair       bool   `json:"fair"`
		Tenants    int    `json:"tenants"`
		TopTenants []struct {
			Tenant, Label string
			Weight        float64
			Depth         uint64
		} `json:"top_tenants"`
	}
	getJSON(t, admin+"/v1/queues/shared", &qs)
	// At 1/h the first slot comes at once: one job may have left. A job the scheduler moves
	// while the depth is read counts twice (the scheduler keeps 2 ahead at this rate).
	if !qs.Fair || qs.Depth < 7 || qs.Depth > 10 || qs.Tenants < 1 || len(qs.TopTenants) != qs.Tenants {
		t.Fatalf("queue status = %+v, want fair, depth 8 (7 once the first slot's job left, up to 2 more counted twice), tenants listed", qs)
	}
	// Each job is in its tenant's backlog or was handed to the workers: the counts add up
	// once the scheduler has written them (once a second).
	type tenantStatus struct {
		Tenant    string  `json:"tenant"`
		Label     string  `json:"label"`
		Depth     uint64  `json:"depth"`
		Delivered *uint64 `json:"delivered"`
	}
	ids := map[string]string{} // by value
	testenv.WaitFor(t, 10*time.Second, "tenant depths and delivered counts to add up to 8", func() bool {
		var sum uint64
		for _, v := range []string{"gold", "plain"} {
			var ts tenantStatus
			getJSON(t, admin+"/v1/queues/shared/tenants/"+v, &ts)
			if len(ts.Tenant) != 32 || ts.Delivered == nil {
				t.Fatalf("tenant %s: %+v", v, ts)
			}
			ids[v] = ts.Tenant
			sum += ts.Depth + *ts.Delivered
		}
		return sum == 8
	})
	// A tenant's id is keyed with the deployment's id secret: not the SHA-256 of its value,
	// which anyone could compute from an API key to learn whether it is a customer's.
	for v, id := range ids {
		sum := sha256.Sum256([]byte(v))
		if id == hex.EncodeToString(sum[:16]) {
			t.Errorf("tenant %s's id %s is the unsalted SHA-256 of its value", v, id)
		}
	}
	if ids["gold"] == ids["plain"] {
		t.Fatalf("two tenants share the id %s", ids["gold"])
	}
	// The value and the id find the same tenant, shown by its label, never by its value.
	var byID tenantStatus
	getJSON(t, admin+"/v1/queues/shared/tenants/"+ids["gold"], &byID)
	if byID.Tenant != ids["gold"] || byID.Label != "gold-co" {
		t.Errorf("gold by id: %+v, want tenant %s labelled gold-co", byID, ids["gold"])
	}
	found := false
	for _, tt := range qs.TopTenants {
		if tt.Tenant == ids["gold"] {
			found = true
			if tt.Label != "gold-co" || tt.Weight != 3 {
				t.Errorf("gold listed as %+v, want its label and weight 3", tt)
			}
		}
	}
	if !found {
		t.Errorf("gold (%s) not among the top tenants %+v", ids["gold"], qs.TopTenants)
	}
	resp, err := http.Get(admin + "/v1/queues/nope/tenants/gold")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("tenant of an unknown queue: %d %s, want a 404 problem", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	metrics := getText(t, admin+"/metrics")
	if !strings.Contains(metrics, `sluice_queue_tenants{queue="shared"}`) {
		t.Errorf("no sluice_queue_tenants for the fair queue in /metrics")
	}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(getText(t, url)), v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

func getText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}
