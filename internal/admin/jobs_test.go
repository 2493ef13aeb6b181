package admin

import (
	"context"
	"strconv"
	"testing"
	"time"

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

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
