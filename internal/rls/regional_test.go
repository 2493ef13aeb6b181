package rls

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-rl/sluice/internal/regions"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/limit"
)

// TestRegionalLimit: a global rule behind a descriptor is decided against the part of its limit
// Options.RegionalLimit returns (regions.Cut, as *regions.Holder.Limit does), through a real
// gRPC client. At half, 5 of the rule's 10 and current_limit 5; a cost above the region's part
// but within the whole limit is OVER_LIMIT until the renewal, not refused forever. At 0: every
// call OVER_LIMIT with current_limit 0 and the wait until the renewal, no counter touched in
// Redis; a check (hits_addend 0) and a shadow descriptor still answer OK.
func TestRegionalLimit(t *testing.T) {
	var fraction atomic.Value
	fraction.Store(0.5)
	const wait = 700 * time.Millisecond
	dir := t.TempDir()
	writeDomains(t, dir, map[string]string{"d.yaml": `domain: d
descriptors:
  - {key: k, rule: tokens-per-key}
  - {key: s, rule: tokens-per-key, shadow_mode: true}
`})
	cfg := testConfig(t, dir)
	cfg.Rules[0].Global = true // tokens-per-key: a config with regions says so (config checks it)
	rds := testenv.Redis(t)
	reg := prometheus.NewRegistry()
	srv, err := New(cfg, Options{Limiter: limit.NewRedis(rds.Client, limit.RedisConfig{}), Registerer: reg,
		RegionalLimit: func(rule string, spec limit.Limit) (limit.Limit, time.Duration, bool) {
			cut, ok := regions.Cut(spec, fraction.Load().(float64))
			return cut, wait, ok
		}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, time.Second) }()
	t.Cleanup(func() { cancel(); <-done })
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	b := &bundle{srv: srv, reg: reg, client: rlsv3.NewRateLimitServiceClient(conn), conn: conn, dir: dir, redis: rds}

	ok := 0
	for range 8 {
		st := b.ask(t, "d", 0, desc("k", "half")).Statuses[0]
		if st.Code == rlsv3.RateLimitResponse_OK {
			ok++
		}
		if st.CurrentLimit.GetRequestsPerUnit() != 5 {
			t.Fatalf("at half: current_limit %d, want 5", st.CurrentLimit.GetRequestsPerUnit())
		}
	}
	if ok != 5 {
		t.Errorf("at half of 10: %d of 8 OK, want 5", ok)
	}
	st := b.ask(t, "d", 0, hits(desc("k", "heavy"), 6)).Statuses[0]
	if st.Code != rlsv3.RateLimitResponse_OVER_LIMIT || st.DurationUntilReset.AsDuration() != wait {
		t.Errorf("a cost of 6 at half of 10: %v, reset %v; want OVER_LIMIT until the renewal (%v)", st.Code, st.DurationUntilReset.AsDuration(), wait)
	}

	fraction.Store(0.0)
	keys := func() int {
		n, err := rds.Client.Keys(context.Background(), "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return len(n)
	}
	before := keys()
	for i := range 5 {
		st := b.ask(t, "d", 0, desc("k", "zero")).Statuses[0]
		if st.Code != rlsv3.RateLimitResponse_OVER_LIMIT || st.CurrentLimit.GetRequestsPerUnit() != 0 || st.DurationUntilReset.AsDuration() != wait {
			t.Fatalf("call %d at share 0: %v, current_limit %d, reset %v; want OVER_LIMIT, 0, %v", i+1, st.Code,
				st.CurrentLimit.GetRequestsPerUnit(), st.DurationUntilReset.AsDuration(), wait)
		}
	}
	if resp := b.ask(t, "d", 0, hits(desc("k", "zero"), 0)); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("a check (hits_addend 0) at share 0: %v, want OK", resp.OverallCode)
	}
	if resp := b.ask(t, "d", 0, desc("s", "zero")); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("a shadow descriptor at share 0: %v, want OK", resp.OverallCode)
	}
	if n := keys(); n != before {
		t.Errorf("Redis keys %d, then %d: a share of 0 must not touch the limiter", before, n)
	}
	if got := testenv.Metric(t, reg, "sluice_decisions_total", "rule", "tokens-per-key", "outcome", "rejected"); got != 3+1+5 {
		t.Errorf("rejected decisions %v, want 9 (3 at half, the heavy call, 5 at share 0)", got)
	}
	if got := testenv.Metric(t, reg, "sluice_decisions_total", "rule", "tokens-per-key", "outcome", "shadow"); got != 1 {
		t.Errorf("shadow decisions %v, want 1", got)
	}
}
