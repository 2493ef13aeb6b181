package app

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// syncBuffer is a bytes.Buffer that a logger and a test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// An ingress with nats and no redis says at start that nothing drains its queues, and
// sluice_queue_consumers{queue} says 0 until a worker process drains the queue, then 1; 0 again
// once it stopped. (Before: no warning, and no metric an alert could catch such a queue with.)
func TestQueueConsumersCountsWorkers(t *testing.T) {
	ns := testenv.NATS(t)
	rs := testenv.Redis(t)
	up := workertest.NewRecorder(t)
	dir := t.TempDir()
	file := func(redis string) string {
		return fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
upstream: %s
nats: { url: %s }
%sshutdown_timeout: 2s
queues:
  - name: orders
    rate: 10/s
    target: POST %s/jobs
`, up.URL, ns.URL, redis, up.URL)
	}
	logs := &syncBuffer{}
	path := filepath.Join(dir, "ingress.yaml")
	if err := os.WriteFile(path, []byte(file("")), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan [2]string, 1)
	go func() {
		done <- Ingress{ConfigPath: path, Logger: slog.New(slog.NewTextHandler(logs, nil)),
			Ready: func(l, a string) { ready <- [2]string{l, a} }}.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ingress: %v", err)
		}
	})
	var addrs [2]string
	select {
	case addrs = <-ready:
	case err := <-done:
		t.Fatalf("ingress: %v", err)
	}
	if !strings.Contains(logs.String(), "no worker drains these queues") {
		t.Errorf("the ingress's log does not say that nothing drains its queues:\n%s", logs)
	}
	consumers := regexp.MustCompile(`(?m)^sluice_queue_consumers\{queue="orders"\} (\d+)$`)
	gauge := func() string {
		m := consumers.FindStringSubmatch(do(t, "GET", "http://"+addrs[1]+"/metrics", "").body)
		if m == nil {
			return ""
		}
		return m[1]
	}
	testenv.WaitFor(t, 10*time.Second, "sluice_queue_consumers 0 with no worker", func() bool { return gauge() == "0" })

	wpath := filepath.Join(dir, "worker.yaml")
	if err := os.WriteFile(wpath, []byte(file(fmt.Sprintf("redis: { url: %s }\n", rs.URL()))), 0o644); err != nil {
		t.Fatal(err)
	}
	wctx, stopWorker := context.WithCancel(context.Background())
	wdone := make(chan error, 1)
	go func() { wdone <- Worker{ConfigPath: wpath, Logger: testLogger()}.Run(wctx) }()
	testenv.WaitFor(t, 10*time.Second, "sluice_queue_consumers 1 with a worker", func() bool { return gauge() == "1" })
	stopWorker()
	if err := <-wdone; err != nil {
		t.Fatalf("worker: %v", err)
	}
	testenv.WaitFor(t, 10*time.Second, "sluice_queue_consumers 0 once the worker stopped", func() bool { return gauge() == "0" })
}

// readWorkers lists each worker present once, while every one of them rewrites its entry as
// fast as it can: a watcher's end of initial values counts messages, and a key rewritten as
// the watch begins came twice before it while another came after (the history then lost a
// worker's attempts, and sluice_queue_consumers counted a worker twice).
func TestReadWorkersWhileTheyRewrite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(testenv.Connect(t, testenv.NATS(t).URL))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: presenceBucket, TTL: presenceTTL,
		History: 1, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	const writers = 8
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range writers {
		key := fmt.Sprintf("w%d", i)
		if _, err := kv.Put(ctx, key, announcement("h", time.Now(), []string{"q"}, nil)); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for wctx.Err() == nil {
				_, _ = kv.Put(wctx, key, announcement("h", time.Now(), []string{"q"}, nil))
			}
		}()
	}
	defer func() { stop(); wg.Wait() }()
	for n := range 30 {
		ws, err := readWorkers(ctx, js, kv)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]int{}
		for _, w := range ws {
			seen[w.ID]++
		}
		for i := range writers {
			if k := fmt.Sprintf("w%d", i); seen[k] != 1 {
				t.Fatalf("read %d: %s listed %d times, want once (%d entries: %v)", n, k, seen[k], len(ws), seen)
			}
		}
	}
	// A deleted entry is not listed.
	stop()
	wg.Wait()
	if err := kv.Delete(ctx, "w0"); err != nil {
		t.Fatal(err)
	}
	if ws, err := readWorkers(ctx, js, kv); err != nil || len(ws) != writers-1 {
		t.Fatalf("after deleting w0: %d entries (%v), want %d", len(ws), err, writers-1)
	}
}
