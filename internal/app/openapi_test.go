package app

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/openapi"
)

// TestOpenAPITour exercises every operation of the job API's and the admin listener's OpenAPI
// documents against a running ingress, each exchange validated by the package's Validator
// (TestMain fails the run when a full run left one out); it checks that every route the
// ingress serves is described, and that the admin listener's /openapi.json lists them all.
func TestOpenAPITour(t *testing.T) {
	dir := t.TempDir()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/bad" {
			http.Error(w, "no", http.StatusBadRequest) // a permanent failure: dead-lettered
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(up.Close)
	r := start(t, dir, fmt.Sprintf(`listen: %s
admin_listen: %s
data_dir: %s
upstream: %s
rules:
  - name: jobs-per-ip
    match: { methods: [POST], path: /v1/queues/* }
    key: [ip]
    algorithm: token_bucket
    limit: 1000
    period: 1s
queues:
  - name: plain
    rate: 50/s
    max_attempts: 1
    target: POST %s/bad
  - name: shared
    rate: 50/s
    tenant: header:X-Tenant
    fair: true
    max_delay: 24h
    target: POST %s/ok
`, freeAddr(t), freeAddr(t), filepath.Join(dir, "data"), up.URL, up.URL, up.URL))

	t.Run("routes", func(t *testing.T) {
		for _, c := range []struct {
			doc    []byte
			routes []string
		}{{openapi.Job(), r.publicRoutes}, {openapi.Admin(), r.adminRoutes}} {
			if len(c.routes) < 3 {
				t.Fatalf("routes %v: too few to be the server's", c.routes)
			}
			missing, err := openapi.Undescribed(c.doc, c.routes)
			if err != nil || len(missing) > 0 {
				t.Errorf("routes served but not in the OpenAPI document: %v (%v)", missing, err)
			}
		}
	})

	pub, adm := "http://"+r.listen, "http://"+r.admin
	do := func(method, url, body string, hdr ...string) (int, http.Header, []byte) {
		t.Helper()
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, err := http.NewRequest(method, url, rd)
		if err != nil {
			t.Fatal(err)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, b
	}
	want := func(code, status int, what string, b []byte) {
		t.Helper()
		if code != status {
			t.Fatalf("%s: %d %s, want %d", what, code, b, status)
		}
	}
	submit := func(q string, hdr ...string) string {
		t.Helper()
		code, h, b := do("POST", pub+"/v1/queues/"+q+"/jobs", `{"n":1}`, hdr...)
		want(code, http.StatusAccepted, "submit to "+q, b)
		if h.Get("RateLimit-Policy") == "" {
			t.Errorf("202 without RateLimit-Policy: %v", h)
		}
		var a struct{ ID string }
		if err := json.Unmarshal(b, &a); err != nil || a.ID == "" {
			t.Fatalf("202 body %s: %v", b, err)
		}
		return a.ID
	}
	waitState := func(id, state string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			code, _, b := do("GET", pub+"/v1/jobs/"+id, "")
			if code == http.StatusOK && strings.Contains(string(b), `"state":"`+state+`"`) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s not %s after 20s: %d %s", id, state, code, b)
			}
			time.Sleep(20 * time.Millisecond) // polling a condition, with a deadline
		}
	}

	// The job API, and its document.
	code, _, b := do("GET", pub+"/openapi.json", "")
	want(code, http.StatusOK, "GET /openapi.json on listen", b)
	dead := submit("plain", "Idempotency-Key", "tour-1")
	waitState(dead, "failed")
	code, _, b = do("GET", pub+"/v1/jobs/nope", "")
	want(code, http.StatusNotFound, "unknown job", b)

	// Dead letters: list, replay, purge.
	code, _, b = do("GET", adm+"/v1/queues/plain/dead-letters", "")
	want(code, http.StatusOK, "dead letters", b)
	if !strings.Contains(string(b), dead) {
		t.Fatalf("dead letters %s lack %s", b, dead)
	}
	code, _, b = do("POST", adm+"/v1/queues/plain/dead-letters/replay", `{"ids":["`+dead+`"]}`)
	want(code, http.StatusOK, "replay", b)
	code, _, b = do("GET", adm+"/v1/queues/plain/jobs?state=failed&limit=10", "")
	want(code, http.StatusOK, "browse", b)
	code, _, b = do("DELETE", adm+"/v1/queues/plain/dead-letters", "")
	want(code, http.StatusOK, "purge", b)

	// A scheduled job of a fair queue's tenant: read, then canceled by the operator.
	held := submit("shared", "X-Tenant", "gold", "Sluice-Delay", "1h")
	code, _, b = do("GET", adm+"/v1/jobs/"+held, "")
	want(code, http.StatusOK, "operator's job view", b)
	code, _, b = do("DELETE", adm+"/v1/jobs/"+held, "")
	want(code, http.StatusOK, "cancel", b)
	submit("shared", "X-Tenant", "gold")
	code, _, b = do("GET", adm+"/v1/queues/shared/tenants/gold", "")
	want(code, http.StatusOK, "tenant", b)
	code, _, b = do("PATCH", adm+"/v1/queues/shared/tenants/gold", `{"weight":2,"rate":"5/s","in_flight":null}`)
	want(code, http.StatusOK, "tenant settings", b)

	// Queue state and the operating API.
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v1/queues", ""},
		{"GET", "/v1/queues/shared", ""},
		{"PATCH", "/v1/queues/shared", `{"rate":"40/s"}`},
		{"PATCH", "/v1/queues/shared", `{"rate":null}`},
		{"POST", "/v1/queues/shared/pause?for=1m", ""},
		{"POST", "/v1/queues/shared/resume", ""},
		{"GET", "/v1/queues/shared/history?since=600", ""},
		{"GET", "/v1/history", ""},
		{"GET", "/v1/health", ""},
		{"GET", "/v1/rules", ""},
		{"GET", "/v1/regions", ""},
		{"GET", "/healthz", ""},
		{"GET", "/readyz", ""},
		{"GET", "/metrics", ""},
		{"GET", "/ui", ""}, // redirected to /ui/
		{"GET", "/ui/app.js", ""},
	} {
		code, _, b := do(c.method, adm+c.path, c.body)
		want(code, http.StatusOK, c.method+" "+c.path, b)
	}

	// The admin listener's document lists every operation it serves: all of them, here.
	code, _, b = do("GET", adm+"/openapi.json", "")
	want(code, http.StatusOK, "GET /openapi.json on admin_listen", b)
	served, err := openapi.Operations(b)
	if err != nil {
		t.Fatal(err)
	}
	all, _ := openapi.Operations(openapi.Admin())
	if !slices.Equal(served, all) {
		t.Errorf("admin /openapi.json lists %v, want every operation %v", served, all)
	}

	// Every operation of both documents has now been exercised with a valid request.
	for _, d := range []string{"job", "admin"} {
		if missing := api.Unexercised(d); len(missing) > 0 {
			t.Errorf("operations of %s the tour did not exercise: %v", d, missing)
		}
	}
}
