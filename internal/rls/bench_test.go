package rls

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// benchDomain is a domain of a few descriptors, nested and flat, with limits no benchmark
// reaches: every call is a full decision (match, store round trip, statuses, headers).
const benchDomain = `domain: bench
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: tenant
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 1000000000}
`

// BenchmarkShouldRateLimit is one ShouldRateLimit of two descriptors through a real gRPC
// client and server on loopback, counting in a real redis-server, from 8 goroutines per core
// (so ns/op is the inverse of the throughput, not one call's latency), over 1000 client
// addresses.
func BenchmarkShouldRateLimit(b *testing.B) {
	bd := start(b, map[string]string{"bench.yaml": benchDomain})
	// On this shared 2-core machine a round trip can pass the default 50ms store_timeout,
	// which the test config answers OVER_LIMIT (deny): measure decisions, not timeouts.
	cfg := *bd.srv.cfg.Load()
	cfg.StoreTimeout = 5 * time.Second
	if err := bd.srv.SetConfig(&cfg); err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			req := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlcommon.RateLimitDescriptor{
				desc("remote_address", "10.0.0."+strconv.FormatInt(i%1000, 10)),
				desc("tenant", "t"+strconv.FormatInt(i%10, 10), "path", "/v1/orders"),
			}}
			resp, err := bd.client.ShouldRateLimit(context.Background(), req)
			if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
				b.Fatalf("%v %v", resp, err)
			}
		}
	})
}
