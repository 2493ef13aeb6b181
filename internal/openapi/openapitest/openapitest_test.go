package openapitest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// The Validator passes a conforming exchange and counts its operation, and fails with the
// operation and the reason an answer off the document, a request off it that was not refused,
// and an undocumented status; it lets a refused bad request and undocumented paths through.
func TestValidator(t *testing.T) {
	v, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/healthz":
			io.WriteString(w, `{"status":"ok"}`)
		case "/readyz":
			io.WriteString(w, `{"status":"ok","checks":{"nats":"ok"},"extra":1}`) // off the schema
		case "/v1/history":
			w.WriteHeader(http.StatusTeapot) // a status the operation does not list
		case "/v1/queues/q/history":
			if r.URL.Query().Get("since") == "-1" {
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(http.StatusNotFound)
				io.WriteString(w, `{"type":"about:blank","title":"Unknown queue","status":404,"detail":"q"}`)
				return
			}
			io.WriteString(w, `{"queue":"q","interval_seconds":5,"points":[]}`)
		default:
			w.WriteHeader(http.StatusOK)
		}
	}))
	t.Cleanup(srv.Close)
	v.Serve(t, "admin", strings.TrimPrefix(srv.URL, "http://"))
	c := &http.Client{Transport: v}
	get := func(method, path string) error {
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := get("GET", "/healthz"); err != nil {
		t.Errorf("conforming /healthz: %v", err)
	}
	for path, says := range map[string]string{
		"/readyz":     "GET /readyz → 200: answer off the document",
		"/v1/history": "GET /v1/history → 418: answer off the document: status is not supported",
	} {
		if err := get("GET", path); err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("GET %s: %v, want an error saying %q", path, err, says)
		}
	}
	// A request off the document (since must be >= 1) must be refused with a 4xx.
	if err := get("GET", "/v1/queues/q/history?since=0"); err == nil || !strings.Contains(err.Error(), "was not refused with a 4xx") {
		t.Errorf("an off-document request answered 200: %v, want a failure", err)
	}
	if err := get("GET", "/v1/queues/q/history?since=-1"); err != nil {
		t.Errorf("an off-document request refused with a documented 404: %v, want it passed", err)
	}
	if err := get("GET", "/not/documented"); err != nil {
		t.Errorf("an undocumented path: %v, want it passed through", err)
	}
	if got := len(v.Failures()); got != 3 {
		t.Errorf("%d failures recorded, want 3: %v", got, v.Failures())
	}
	missing := v.Unexercised("admin")
	if slices.Contains(missing, "GET /healthz") {
		t.Errorf("GET /healthz validated but not counted as exercised")
	}
	if !slices.Contains(missing, "GET /v1/queues/{queue}/history") {
		t.Errorf("only off-document requests were sent to the history, yet it counts as exercised")
	}
	if len(missing) == 0 {
		t.Errorf("every admin operation counted as exercised after a handful of requests")
	}
}
