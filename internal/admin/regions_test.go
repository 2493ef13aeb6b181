package admin

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/regions"
	"github.com/sluice-rl/sluice/internal/testenv"
)

// TestRegionsAPI: GET /v1/regions shows each global queue's leases as a real coordinator
// (a JetStream key-value bucket) holds them: the share, expiry and demand each region
// renewed with, a region without a lease on its safe share, and, once the coordinator is
// gone, why it cannot be read. The answers are held to the OpenAPI document (get).
func TestRegionsAPI(t *testing.T) {
	coord := testenv.NATS(t)
	js, err := jetstream.New(testenv.Connect(t, coord.URL))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cfg := &config.Config{Region: "a", Regions: &config.Regions{Names: []string{"a", "b", "c"}, SafeEven: true,
		Lease: 2 * time.Second, Renew: 500 * time.Millisecond},
		Queues: []config.Queue{{Name: "plain", Rate: config.Rate{N: 10, Per: time.Second}},
			{Name: "llm", Rate: config.Rate{N: 60, Per: time.Second}, Global: true}},
		Rules: []config.Rule{{Name: "per-key", Limit: 600, Period: time.Minute, Global: true}, {Name: "local", Limit: 5, Period: time.Second}}}
	s := New("127.0.0.1:0", prometheus.NewRegistry())
	var later time.Duration // how far the API's clock runs ahead
	(&Regions{Config: func() *config.Config { return cfg }, Now: func() time.Time { return time.Now().Add(later) },
		Read: func(ctx context.Context, q string) (regions.Record, bool, error) { return regions.Read(ctx, js, q) }}).Mount(s)
	read := func() RegionsStatus {
		t.Helper()
		res, body := get(t, s.Handler(), "/v1/regions")
		var st RegionsStatus
		if res.StatusCode != 200 || json.Unmarshal(body, &st) != nil {
			t.Fatalf("GET /v1/regions: %d %s", res.StatusCode, body)
		}
		return st
	}
	// No region has renewed: every region listed, none with a lease.
	st := read()
	if st.Region != "a" || len(st.Queues) != 1 || st.Queues[0].Queue != "llm" || st.Queues[0].SafeShare != 20 ||
		len(st.Queues[0].Leases) != 3 || !st.Queues[0].Leases[0].OnSafeShare || st.Coordinator != "ok" {
		t.Fatalf("before any renewal: %+v", st)
	}
	terms := regions.Terms{Budget: 60, Lease: 2 * time.Second, Renew: 500 * time.Millisecond, Hold: time.Millisecond}
	a, b := regions.NewCoordinator(js, "a", nil), regions.NewCoordinator(js, "b", nil)
	if _, _, err := a.Renew(ctx, "llm", 100, terms, nil); err != nil { // makes the record, held for 1 ms
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "both regions on leases", func() bool {
		la, _, err1 := a.Renew(ctx, "llm", 100, terms, nil)
		lb, _, err2 := b.Renew(ctx, "llm", 5, terms, nil)
		return err1 == nil && err2 == nil && la.Share > 0 && lb.Share == 5
	})
	st = read()
	q := st.Queues[0]
	la, lb, lc := q.Leases[0], q.Leases[1], q.Leases[2]
	t.Logf("%+v", q)
	if la.Region != "a" || la.OnSafeShare || la.Demand != 100 || la.Expires == nil || !la.Expires.After(time.Now()) ||
		la.Renewed == nil || la.Share <= 0 || la.Held < la.Share {
		t.Errorf("a's lease: %+v", la)
	}
	if lb.Region != "b" || lb.Share != 5 || lb.Demand != 5 || lb.OnSafeShare {
		t.Errorf("b's lease: %+v", lb)
	}
	if lc.Region != "c" || !lc.OnSafeShare || lc.Lost || lc.Renewed != nil || lc.Share != 0 {
		t.Errorf("c, which never renewed: %+v", lc)
	}
	if q.Held > q.Budget || q.Held < la.Share+lb.Share {
		t.Errorf("held %v of %v with shares %v and %v", q.Held, q.Budget, la.Share, lb.Share)
	}
	// A global rule's budget: its limit per key per second, its own record.
	if _, _, err := a.Renew(ctx, "rule.per-key", 3, regions.Terms{Budget: 10, Lease: 2 * time.Second, Renew: 500 * time.Millisecond}, nil); err != nil {
		t.Fatal(err)
	}
	if rs := read().Rules; len(rs) != 1 || rs[0].Rule != "per-key" || rs[0].Queue != "" || rs[0].Budget != 10 || len(rs[0].Leases) != 3 ||
		rs[0].Leases[0].Demand != 3 {
		t.Errorf("global rules: %+v", rs)
	}
	// Seen a lease and a renew period after both leases expired: both regions lost.
	later = 2*time.Second + 2500*time.Millisecond + 100*time.Millisecond
	for _, l := range read().Queues[0].Leases[:2] {
		if !l.OnSafeShare || !l.Lost || l.Held != 0 {
			t.Errorf("%s, a lease and a renewal past its lease: %+v", l.Region, l)
		}
	}
	later = 0
	// The coordinator is gone: the answer says so, at once, and lists the queue without leases.
	coord.Server.Shutdown()
	coord.Server.WaitForShutdown()
	start := time.Now()
	st = read()
	if st.Coordinator == "ok" || st.Coordinator == "" || len(st.Queues) != 1 || len(st.Queues[0].Leases) != 0 || len(st.Rules) != 1 ||
		time.Since(start) > DefaultCheckTimeout+time.Second {
		t.Errorf("coordinator down: %+v after %v", st, time.Since(start))
	}
	// Without regions: an empty answer.
	cfg = &config.Config{}
	if st := read(); st.Region != "" || len(st.Regions) != 0 || len(st.Queues) != 0 {
		t.Errorf("without regions: %+v", st)
	}
}
