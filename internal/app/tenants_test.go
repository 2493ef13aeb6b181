package app

import (
	"bytes"
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

// PATCH /v1/queues/{q}/tenants/{t} sets a tenant's own rate (and weight, in_flight) at run
// time: the workers apply it — tenant slow, capped at 2/s, gets 2/s while tenant fast drains at
// the queue's rate — null goes back to the file's, and bad patches get a 400 that names the
// field.
func TestTenantSettingsAtRunTime(t *testing.T) {
	dir := t.TempDir()
	rec := workertest.NewRecorder(t)
	r := start(t, dir, fmt.Sprintf(`listen: %s
admin_listen: %s
data_dir: %s
upstream: %s
queues:
  - name: shared
    rate: 1/h
    tenant: header:X-Tenant
    fair: true
    max_in_flight: 4
    pause_scope: tenant
    target: POST %s/jobs
`, freeAddr(t), freeAddr(t), filepath.Join(dir, "data"), rec.URL, rec.URL))

	patch := func(path, body string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPatch, "http://"+r.admin+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	for _, bad := range []struct{ body, says string }{
		{`{"rate":"fast"}`, "rate:"},
		{`{"weight":0}`, "weight:"},
		{`{"in_flight":0}`, "in_flight:"},
		{`{"burst":2}`, `unknown field`},
		{`[]`, "want a JSON object"},
	} {
		if code, b := patch("/v1/queues/shared/tenants/slow", bad.body); code != http.StatusBadRequest || !strings.Contains(string(b), bad.says) {
			t.Errorf("PATCH %s: %d %s, want 400 naming %q", bad.body, code, b, bad.says)
		}
	}
	if code, _ := patch("/v1/queues/nope/tenants/slow", `{"rate":"2/s"}`); code != http.StatusNotFound {
		t.Errorf("PATCH of an unknown queue's tenant: %d, want 404", code)
	}
	code, b := patch("/v1/queues/shared/tenants/slow", `{"rate":"2/s","weight":2}`)
	var view struct {
		Tenant   string
		Override struct {
			Weight float64
			Rate   string
		}
	}
	if err := json.Unmarshal(b, &view); code != http.StatusOK || err != nil || view.Override.Rate != "2/s" || view.Override.Weight != 2 ||
		len(view.Tenant) != 32 {
		t.Fatalf("PATCH rate 2/s: %d %s", code, b)
	}
	// The queue runs at a rate that holds nothing back; slow's 2/s holds it alone.
	if code, b := patch("/v1/queues/shared", `{"rate":"50/s"}`); code != http.StatusOK {
		t.Fatalf("PATCH queue rate: %d %s", code, b)
	}
	post := func(tenant string, i int) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+r.listen+"/v1/queues/shared/jobs", strings.NewReader(fmt.Sprintf("%s-%d", tenant, i)))
		req.Header.Set("X-Tenant", tenant)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("submit: %d", resp.StatusCode)
		}
	}
	// fast's jobs first: once they went out at 50/s, every worker has the controls.
	for i := range 10 {
		post("fast", i)
	}
	rec.WaitCount(t, 30*time.Second, "fast's jobs", func(n int) bool { return n >= 10 })
	for i := range 10 {
		post("slow", i)
		post("fast", 10+i)
	}
	rec.WaitCount(t, 30*time.Second, "every job", func(n int) bool { return n >= 30 })
	var slow, fast []time.Time
	for _, a := range rec.Arrivals() {
		if bytes.HasPrefix(a.Body, []byte("slow-")) {
			slow = append(slow, a.At)
		} else {
			fast = append(fast, a.At)
		}
	}
	slowSpan, fastSpan := slow[len(slow)-1].Sub(slow[0]), fast[len(fast)-1].Sub(fast[10])
	t.Logf("slow's 10 jobs over %v, fast's second 10 over %v", slowSpan, fastSpan)
	if slowSpan < 4200*time.Millisecond { // 9 intervals of 500ms, less the scheduler's tick
		t.Errorf("slow's 10 jobs went out over %v, want its 2/s: >= 4.2s", slowSpan)
	}
	if fastSpan > 2*time.Second {
		t.Errorf("fast's 10 jobs went out over %v, want the queue's pace (50/s), not slow's", fastSpan)
	}
	// The tenant view shows its settings and its in-flight cap against its deliveries now.
	if code, b := patch("/v1/queues/shared/tenants/slow", `{"in_flight":3}`); code != http.StatusOK {
		t.Fatalf("PATCH in_flight: %d %s", code, b)
	}
	var tv struct {
		Weight      float64
		MaxInFlight int64  `json:"max_in_flight"`
		Delivering  *int64 `json:"delivering"`
		Override    struct {
			InFlight int64 `json:"in_flight"`
		}
	}
	var err error
	// The last deliveries' places come back just after their answers reached the upstream's
	// recorder: a worker gives each back when it has read the answer, or keeps it up to 20 ms
	// for its next delivery (inflight.Reuse).
	testenv.WaitFor(t, 5*time.Second, "the last deliveries' places to come back", func() bool {
		var q struct {
			Delivering *int64 `json:"delivering"`
		}
		for _, v := range []struct {
			path string
			into any
		}{{"/v1/queues/shared", &q}, {"/v1/queues/shared/tenants/slow", &tv}} {
			var resp *http.Response
			if resp, err = http.Get("http://" + r.admin + v.path); err != nil {
				return true
			}
			err = json.NewDecoder(resp.Body).Decode(v.into)
			resp.Body.Close()
			if err != nil {
				return true
			}
		}
		return q.Delivering != nil && *q.Delivering == 0
	})
	if err != nil || tv.Weight != 2 || tv.MaxInFlight != 3 || tv.Override.InFlight != 3 || tv.Delivering == nil || *tv.Delivering != 0 {
		t.Errorf("tenant view after PATCH in_flight 3: %+v (%v); want weight 2, max_in_flight 3, delivering 0", tv, err)
	}
	// The queue shows its places against max_in_flight and its paused tenants, in the API and
	// the metrics.
	resp, err := http.Get("http://" + r.admin + "/v1/queues/shared")
	if err != nil {
		t.Fatal(err)
	}
	var qv struct {
		MaxInFlight   int64  `json:"max_in_flight"`
		Delivering    *int64 `json:"delivering"`
		PausedTenants *int   `json:"paused_tenants"`
	}
	err = json.NewDecoder(resp.Body).Decode(&qv)
	resp.Body.Close()
	if err != nil || qv.MaxInFlight != 4 || qv.Delivering == nil || *qv.Delivering != 0 || qv.PausedTenants == nil || *qv.PausedTenants != 0 {
		t.Errorf("queue view: %+v (%v); want max_in_flight 4, delivering 0, paused_tenants 0", qv, err)
	}
	resp, err = http.Get("http://" + r.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`sluice_queue_max_in_flight{queue="shared"} 4`, `sluice_queue_delivering{queue="shared"} 0`,
		`sluice_queue_paused_tenants{queue="shared"} 0`} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// null goes back to the file's: no settings of its own left. The tenant's id names the
	// same tenant as its value.
	if code, b := patch("/v1/queues/shared/tenants/"+view.Tenant, `{"rate":null,"weight":null,"in_flight":null}`); code != http.StatusOK || !strings.Contains(string(b), `"override":{}`) {
		t.Errorf("PATCH nulls: %d %s, want an empty override", code, b)
	}
}
