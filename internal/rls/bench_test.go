package rls

import (
	"context"
	"strconv"
	"sync/atomic"
	"syscall"
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

// benchStart serves benchDomain, counting in a fresh redis-server, with a store_timeout no
// round trip reaches: on this shared 2-core machine a round trip can pass the default 50ms,
// which the test config answers OVER_LIMIT (deny): measure decisions, not timeouts.
func benchStart(b *testing.B) *bundle {
	bd := start(b, map[string]string{"bench.yaml": benchDomain})
	cfg := *bd.srv.cfg.Load()
	cfg.StoreTimeout = 5 * time.Second
	if err := bd.srv.SetConfig(&cfg); err != nil {
		b.Fatal(err)
	}
	return bd
}

// benchRequest is the i-th call: a flat remote_address over 1000 values and a nested
// tenant/path pair over 10 tenants.
func benchRequest(i int64) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlcommon.RateLimitDescriptor{
		desc("remote_address", "10.0.0."+strconv.FormatInt(i%1000, 10)),
		desc("tenant", "t"+strconv.FormatInt(i%10, 10), "path", "/v1/orders"),
	}}
}

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// parallel runs call from 8 goroutines per core and reports, besides ns/op (the inverse of
// the throughput, not one call's latency), cpu-ns/op: the CPU time of this process (client,
// server and go-redis, not redis-server) per call, which other load on a shared machine
// disturbs far less than the wall clock.
func parallel(b *testing.B, call func(i int64) error) {
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(8)
	b.ResetTimer()
	cpu := cpuTime()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := call(n.Add(1)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
}

// BenchmarkShouldRateLimit is one ShouldRateLimit of two descriptors through a real gRPC
// client and server on loopback, counting in a real redis-server.
func BenchmarkShouldRateLimit(b *testing.B) {
	bd := benchStart(b)
	parallel(b, func(i int64) error {
		resp, err := bd.client.ShouldRateLimit(context.Background(), benchRequest(i))
		if err == nil && resp.OverallCode != rlsv3.RateLimitResponse_OK {
			b.Fatalf("%v", resp)
		}
		return err
	})
}

// BenchmarkShouldRateLimitHandler is the same call without gRPC: the service's own work per
// call (match, keys, the limiter's pipelined round trip to redis-server, statuses, headers,
// metrics), the request built outside the timed region's allocations being the caller's.
func BenchmarkShouldRateLimitHandler(b *testing.B) {
	bd := benchStart(b)
	reqs := make([]*rlsv3.RateLimitRequest, 1000)
	for i := range reqs {
		reqs[i] = benchRequest(int64(i))
	}
	parallel(b, func(i int64) error {
		resp, err := bd.srv.ShouldRateLimit(context.Background(), reqs[i%int64(len(reqs))])
		if err == nil && resp.OverallCode != rlsv3.RateLimitResponse_OK {
			b.Fatalf("%v", resp)
		}
		return err
	})
}
