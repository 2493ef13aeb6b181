package ingress

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestBodyLimitWhetherForwardedOrDeferred checks that a request a rule may defer is held to
// its queue's max_body_bytes when it is forwarded too, and that the 413 names the key, the
// limit and the queue. Before, a body over the limit was forwarded while the rule allowed it
// and refused (413, "larger than 300 bytes") only once the request would be queued.
func TestBodyLimitWhetherForwardedOrDeferred(t *testing.T) {
	f := newQueueFixture(t, deferYAML)
	big := strings.Repeat("x", 301)
	check := func(what string, res *http.Response) {
		t.Helper()
		p := readProblem(t, res, http.StatusRequestEntityTooLarge)
		for _, want := range []string{"max_body_bytes", "300", `"orders"`} {
			if !strings.Contains(p.Detail, want) {
				t.Errorf("%s: 413 detail %q does not name %s", what, p.Detail, want)
			}
		}
	}
	check("forwarded", f.do("POST", "/api/orders", strings.NewReader(big), "X-API-Key", "k1"))
	// Without a Content-Length, the body is cut off as it is read, and answered the same.
	r := httptestRequest("POST", "/api/orders", f.peerAddr)
	r.Header.Set("X-API-Key", "k2")
	r.Body, r.ContentLength = io.NopCloser(strings.NewReader(big)), -1
	check("forwarded, chunked", serve(f.handler, r))
	// Within the limit it is forwarded; over the rule's limit, deferred bodies are refused alike.
	readEchoed(t, f.do("POST", "/api/orders", strings.NewReader("small"), "X-API-Key", "k3"))
	check("deferred", f.do("POST", "/api/orders", strings.NewReader(big), "X-API-Key", "k3"))
	check("job API", f.do("POST", "/v1/queues/orders/jobs", strings.NewReader(big)))
	// A rule that never defers leaves bodies alone.
	readEchoed(t, f.do("POST", "/elsewhere", strings.NewReader(big)))
}

// TestErrorTextsClean checks that problem details speak the client's words, not Go package
// prefixes ("queue: unknown queue: no queue named ...").
func TestErrorTextsClean(t *testing.T) {
	f := newQueueFixture(t, deferYAML)
	for _, target := range []string{"/v1/queues/nope/jobs", "/v1/queues/reports/jobs"} {
		p := readProblem(t, f.do("POST", target, strings.NewReader("x")), http.StatusNotFound)
		if strings.Contains(p.Detail, "queue:") || strings.Contains(p.Detail, "unknown queue:") {
			t.Errorf("%s: detail %q carries a package prefix", target, p.Detail)
		}
	}
}

// TestQueueFullOfBytes checks a queue at its max_bytes, JetStream's own bound: new jobs get
// 429 with a Retry-After and a problem that names max_bytes, as at max_depth.
func TestQueueFullOfBytes(t *testing.T) {
	f := newQueueFixture(t, `
queues:
  - {name: big, rate: 1/s, max_body_bytes: 1000, max_bytes: 4000, target: "POST http://127.0.0.1:1/x"}
`)
	body := strings.Repeat("x", 900)
	var res *http.Response
	for i := 0; ; i++ {
		if i == 10 {
			t.Fatal("10 jobs of 900 bytes in a queue of max_bytes 4000")
		}
		if res = f.do("POST", "/v1/queues/big/jobs", strings.NewReader(body)); res.StatusCode != http.StatusAccepted {
			break
		}
	}
	p := readProblem(t, res, http.StatusTooManyRequests)
	if res.Header.Get("Retry-After") == "" || p.RetryAfter < 1 || !strings.Contains(p.Detail, "max_bytes 4000") {
		t.Fatalf("Retry-After %q, problem %+v: want a Retry-After and max_bytes named", res.Header.Get("Retry-After"), p)
	}
}
