package rls

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/limit"
)

// testConfig is a Sluice config with one rule a descriptor can name, and an rls section over
// dir. Its store_timeout (2s) is one no Redis round trip reaches on a loaded machine: at the
// default 50ms a slow EVALSHA is a store error, which on_store_error: deny answers OVER_LIMIT
// (TestOverLimitAnswer's first call, beside other builds), and these tests are of decisions,
// not of timeouts. A stopped Redis still fails at once (connection refused).
func testConfig(t testing.TB, dir string) *config.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	data := []byte(`upstream: http://127.0.0.1:1
on_store_error: deny
store_timeout: 2s
rules:
  - name: tokens-per-key
    key: [header:X-Key]
    algorithm: token_bucket
    limit: 10
    period: 1m
  - name: shadowed
    algorithm: sliding_window
    limit: 1
    period: 1h
    shadow: true
  - name: conns
    algorithm: concurrency
    limit: 2
  - name: open
    algorithm: gcra
    limit: 1
    period: 1h
    on_store_error: allow
rls_listen: 127.0.0.1:0
rls:
  config_dir: ` + dir + "\n")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// writeDomains writes files into dir by name.
func writeDomains(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// bundle is a running rate-limit service over a real listener, counting in a real Redis, and
// a gRPC client of it.
type bundle struct {
	srv    *Server
	reg    *prometheus.Registry
	client rlsv3.RateLimitServiceClient
	conn   *grpc.ClientConn
	dir    string
	redis  *testenv.RedisServer
}

// start serves the domain files given on a loopback listener, counting in a fresh
// redis-server, until the test ends.
func start(t testing.TB, files map[string]string) *bundle {
	t.Helper()
	b := &bundle{dir: t.TempDir(), reg: prometheus.NewRegistry()}
	writeDomains(t, b.dir, files)
	rds := testenv.Redis(t)
	b.redis = rds
	srv, err := New(testConfig(t, b.dir), Options{Limiter: limit.NewRedis(rds.Client, limit.RedisConfig{}), Registerer: b.reg})
	if err != nil {
		t.Fatal(err)
	}
	b.srv = srv
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, time.Second) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	b.conn, b.client = conn, rlsv3.NewRateLimitServiceClient(conn)
	return b
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func (b *bundle) ask(t testing.TB, domain string, hits uint32, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := b.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.Statuses) != len(ds) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(ds))
	}
	return resp
}
