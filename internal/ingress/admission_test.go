package ingress

import (
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/queue"
)

// tenantMaxDepthYAML is the figure: a fair queue whose tenants may each hold 100 jobs
// waiting. At 1/m, with no worker, every accepted job stays waiting in its tenant's backlog.
const tenantMaxDepthYAML = `
queues:
  - name: shared
    rate: 1/m
    tenant: [header:X-API-Key]
    fair: true
    weights: { key-B: 3 }
    tenant_max_depth: 100
    target: "POST http://127.0.0.1:1/x"
`

// TestTenantMaxDepth: tenant A's 101st waiting job gets 429 with a Retry-After from A's own
// backlog and share of the rate, while tenant B's jobs are still accepted; nothing of A's is
// stored beyond 100. Jobs another process stored count too, once the queue is read again.
func TestTenantMaxDepth(t *testing.T) {
	f := newQueueFixture(t, tenantMaxDepthYAML)
	submit := func(apiKey string) *http.Response {
		return f.do("POST", "/v1/queues/shared/jobs", strings.NewReader("x"), "X-API-Key", apiKey)
	}
	for range 5 {
		accepted(t, submit("key-B"), "shared")
	}
	for i := range 100 {
		if res := submit("key-A"); res.StatusCode != http.StatusAccepted {
			t.Fatalf("tenant A's job %d: %d, want 202", i+1, res.StatusCode)
		}
	}
	res := submit("key-A")
	pb := readProblem(t, res, http.StatusTooManyRequests)
	// A's share: 1/m × weight 1 / (1 + B's 3) = 1 job per 240s; one job beyond the bound.
	// The queue's own figure (105 jobs at 1/m) would be 6300s.
	if ra := res.Header.Get("Retry-After"); ra != "240" || pb.RetryAfter != 240 {
		t.Errorf("A's 101st: Retry-After %q, problem %+v; want 240 (one job at A's share, 1/240s)", ra, pb)
	}
	if !strings.Contains(pb.Detail, "tenant_max_depth") || !strings.Contains(pb.Detail, "100") {
		t.Errorf("A's 429 detail %q does not name tenant_max_depth 100", pb.Detail)
	}
	t.Logf("A's 101st: 429, Retry-After %s, %q", res.Header.Get("Retry-After"), pb.Detail)
	accepted(t, submit("key-B"), "shared") // B is still accepted

	// A second later the queue is read again: the 100 are A's backlog in NATS, not only this
	// process's count; and 100 jobs another ingress stored for C count as well.
	c := f.qs.TenantID([]byte("key-C"))
	for range 100 {
		if _, err := f.qs.Publish(f.ctx, &queue.Job{Queue: "shared", Direct: true, Tenant: c, Body: []byte("c")}); err != nil {
			t.Fatal(err)
		}
	}
	f.clock.Advance(time.Second)
	readProblem(t, submit("key-A"), http.StatusTooManyRequests)
	readProblem(t, submit("key-C"), http.StatusTooManyRequests)
	accepted(t, submit("key-B"), "shared")
	b, err := f.qs.Backlog(f.ctx, "shared")
	if err != nil {
		t.Fatal(err)
	}
	a := f.qs.TenantID([]byte("key-A"))
	if b.Tenants[a] != 100 || b.Tenants[c] != 100 || b.Tenants[f.qs.TenantID([]byte("key-B"))] != 7 {
		t.Fatalf("backlogs %v, want A 100, C 100, B 7", b.Tenants)
	}
}

// TestTenantMaxDepthConcurrent: one process admits no more than the bound, however many of a
// tenant's jobs arrive at once (each is counted from the moment it is admitted). It may refuse a
// few early: a job being stored when a reading lands counts twice until its publish returns,
// so at most as many as race (16).
func TestTenantMaxDepthConcurrent(t *testing.T) {
	f := newQueueFixture(t, tenantMaxDepthYAML)
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				r := httptestRequest("POST", "/v1/queues/shared/jobs", f.peerAddr)
				r.Body = http.NoBody
				r.Header.Set("X-API-Key", "key-D")
				res := serve(f.handler, r)
				switch res.StatusCode {
				case http.StatusAccepted:
					ok.Add(1)
				case http.StatusTooManyRequests:
					refused.Add(1)
				default:
					t.Errorf("status %d", res.StatusCode)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("160 concurrent jobs of one tenant: %d accepted, %d refused", ok.Load(), refused.Load())
	if ok.Load() > 100 || ok.Load() < 100-16 || ok.Load()+refused.Load() != 160 {
		t.Fatalf("%d accepted and %d refused, want 100 accepted, at worst 16 fewer, and the rest refused", ok.Load(), refused.Load())
	}
	b, err := f.qs.Backlog(f.ctx, "shared")
	if err != nil {
		t.Fatal(err)
	}
	if n := b.Tenants[f.qs.TenantID([]byte("key-D"))]; n != uint64(ok.Load()) {
		t.Fatalf("tenant D holds %d, want the %d accepted", n, ok.Load())
	}
}
