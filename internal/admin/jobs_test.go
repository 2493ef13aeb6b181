package admin

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

type jobsPage struct {
	Jobs []struct {
		ID, State, Tenant string
		DeadLetter        bool `json:"dead_letter"`
	}
	Next    uint64
	Scanned int
	Source  string
}

// TestJobsAPI: the job browser pages through the jobs in a queue with a cursor, none twice
// and none missed, and lists a recorded state (succeeded) from the status bucket, a page
// bounded by what it scans.
func TestJobsAPI(t *testing.T) {
	e := newHistoryEnv(t, "")
	ids := e.publish(t, "orders", 25)
	var got []string
	cursor := uint64(0)
	for pages := 0; ; pages++ {
		var p jobsPage
		getJSON(t, e.addr, "/v1/queues/orders/jobs?limit=10&cursor="+itoa(cursor), &p)
		for _, j := range p.Jobs {
			got = append(got, j.ID)
			if j.State != "queued" {
				t.Errorf("job %s: state %s, want queued", j.ID, j.State)
			}
		}
		if p.Next == 0 || pages > 5 {
			break
		}
		cursor = p.Next
	}
	if len(got) != 25 || got[0] != ids[0] || got[24] != ids[24] {
		t.Fatalf("paged %d jobs (%v), want the 25 in order", len(got), got)
	}
	now := time.Now().UTC()
	for _, id := range ids[:3] {
		if err := e.qs.SetStatus(context.Background(), queue.Status{ID: id, Queue: "orders", State: queue.StateSucceeded,
			Attempts: 1, CreatedAt: now, Response: &queue.Response{Status: 200}}); err != nil {
			t.Fatal(err)
		}
	}
	var p jobsPage
	getJSON(t, e.addr, "/v1/queues/orders/jobs?state=succeeded", &p)
	if len(p.Jobs) != 3 || p.Source != "status" || p.Jobs[0].State != "succeeded" {
		t.Errorf("succeeded: %+v", p)
	}
	getJSON(t, e.addr, "/v1/queues/reports/jobs?state=succeeded", &p)
	if len(p.Jobs) != 0 || p.Scanned < 3 {
		t.Errorf("another queue's succeeded jobs: %+v, want none after scanning the 3 entries", p)
	}
}

// TestJobsCostBounded: what a page of the job browser costs NATS is bounded (issue 41, item
// 7). Pages of ?state=all leave no consumer behind (before, each left one for 60 s); a
// tenant-filtered page over a deep queue reads at most queue.DefaultMaxGets messages and says
// where to go on (before, up to 5 000); pages beyond the browser's rate get 429 with a
// Retry-After.
func TestJobsCostBounded(t *testing.T) {
	e := newHistoryEnv(t, "")
	ctx := context.Background()
	const deep = queue.DefaultMaxGets + 100
	for range deep {
		if _, err := e.qs.Publish(ctx, &queue.Job{Queue: "orders", Direct: true, Tenant: "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	kv, err := e.js.Stream(ctx, "KV_"+e.name+"_STATUS")
	if err != nil {
		t.Fatal(err)
	}
	consumers := func() int {
		n := 0
		for range kv.ConsumerNames(ctx).Name() {
			n++
		}
		return n
	}
	for range 8 {
		var p jobsPage
		getJSON(t, e.addr, "/v1/queues/orders/jobs?state=all&limit=5", &p)
	}
	// The page deletes its consumer before it answers; the ones an ordered consumer replaced
	// on the way are deleted in the background, within milliseconds.
	testenv.WaitFor(t, 5*time.Second, "no browsing consumer left on the status bucket", func() bool { return consumers() == 0 })

	var p jobsPage
	getJSON(t, e.addr, "/v1/queues/orders/jobs?tenant=bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", &p)
	if len(p.Jobs) != 0 || p.Scanned != queue.DefaultMaxGets || p.Next == 0 {
		t.Errorf("another tenant's page over %d jobs: %d jobs, scanned %d, next %d; want none, %d scanned, a cursor to go on from",
			deep, len(p.Jobs), p.Scanned, p.Next, queue.DefaultMaxGets)
	}
	getJSON(t, e.addr, "/v1/queues/orders/jobs?tenant=bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb&cursor="+itoa(p.Next), &p)
	if len(p.Jobs) != 0 || p.Scanned != 100 || p.Next != 0 {
		t.Errorf("the next page: %d jobs, scanned %d, next %d; want the last 100 scanned and the end", len(p.Jobs), p.Scanned, p.Next)
	}

	// Pages one after another until one is refused: the browser serves at most its burst and
	// its rate since the first (a slow machine only makes the pages slower, never more).
	start := time.Now()
	served, refused := 0, false
	for !refused && served < 200 {
		res, err := http.Get("http://" + e.addr + "/v1/queues/orders/jobs?limit=1")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusTooManyRequests {
			served++
			continue
		}
		refused = true
		if ra, err := strconv.Atoi(res.Header.Get("Retry-After")); err != nil || ra < 1 ||
			res.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("429 with Retry-After %q, Content-Type %q", res.Header.Get("Retry-After"), res.Header.Get("Content-Type"))
		}
	}
	if bound := 2*DefaultPagesPerSecond + int(DefaultPagesPerSecond*time.Since(start).Seconds()) + 1; served > bound {
		t.Errorf("%d pages served in %v before a refusal, want at most the burst and the rate: %d", served, time.Since(start), bound)
	}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
