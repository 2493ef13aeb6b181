package app

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
	"github.com/sluice-rl/sluice/queue"
)

// Worker, in-process: it provisions the queues, drains them, reports ready, and on cancel
// returns nil having stopped everything it started (goleak checks at the end).
func TestWorkerRun(t *testing.T) {
	rs := testenv.Redis(t)
	ns := testenv.NATS(t)
	up := workertest.NewRecorder(t)
	admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	yaml := fmt.Sprintf(`upstream: %s
admin_listen: %s
redis: { url: %q }
nats: { url: %q }
shutdown_timeout: 2s
queues:
  - name: main
    rate: 100/s
    target: POST %s/main
`, up.URL, admin, rs.URL(), ns.URL, up.URL)
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- Worker{ConfigPath: path, Ready: func(addr string) { ready <- addr }}.Run(ctx)
	}()
	select {
	case addr := <-ready:
		if addr != admin {
			t.Errorf("admin on %s, want %s", addr, admin)
		}
	case err := <-done:
		t.Fatalf("Run returned before ready: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("not ready after 30s")
	}
	resp, err := http.Get("http://" + admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz = %d, want 200", resp.StatusCode)
	}

	// Publish through a queue layer of our own, as the ingress would: to the queue's shared
	// stream, the default.
	js, err := jetstream.New(testenv.Connect(t, ns.URL))
	if err != nil {
		t.Fatal(err)
	}
	qs, err := queue.New(context.Background(), js, queue.Options{SharedStreams: config.DefaultSharedStreams})
	if err != nil {
		t.Fatal(err)
	}
	if err := qs.Provision(context.Background(), []queue.Spec{{Name: "main"}}); err != nil {
		t.Fatal(err)
	}
	ids := workertest.Publish(t, qs, "main", 3, true)
	up.WaitCount(t, 10*time.Second, "the jobs", func(n int) bool { return n >= len(ids) })

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after cancel = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of cancel")
	}
	if _, err := http.Get("http://" + admin + "/healthz"); err == nil {
		t.Error("the admin listener still answers after Run returned")
	}
}

// Neither process starts on a Redis that may evict Sluice's keys, and the error names the
// policy (issue 30, item 6); the same Redis with noeviction is fine.
func TestRefuseEvictingRedis(t *testing.T) {
	rs := testenv.Redis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, kv := range [][2]string{{"maxmemory", "64mb"}, {"maxmemory-policy", "allkeys-lru"}} {
		if err := rs.Client.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	yaml := fmt.Sprintf(`upstream: http://127.0.0.1:1
admin_listen: 127.0.0.1:%d
listen: 127.0.0.1:%d
redis: { url: %q }
nats: { url: "nats://127.0.0.1:%d" }
queues:
  - { name: main, rate: 10/s }
`, testenv.FreePort(t), testenv.FreePort(t), rs.URL(), testenv.FreePort(t))
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, run := range map[string]func(context.Context) error{
		"worker":  Worker{ConfigPath: path}.Run,
		"ingress": Ingress{ConfigPath: path}.Run,
	} {
		err := run(ctx)
		if err == nil || !strings.Contains(err.Error(), "allkeys-lru") || !strings.Contains(err.Error(), "noeviction") {
			t.Errorf("%s on an allkeys-lru Redis: %v, want a refusal naming the policy and the fix", name, err)
		}
	}
}
