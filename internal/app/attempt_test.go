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

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// TestAttemptTrueAfterNATSCrash kills nats-server (SIGKILL) while two worker processes drain a
// queue and starts it again: no job is lost, and every job the upstream saw again carries a
// higher Sluice-Attempt than before, although the status writes of the deliveries in flight at
// the crash failed with it (the workers' outboxes keep them, and nobody delivers before they
// land), and the restarted server may hand one job to both workers at once (each claims its
// attempt before sending it).
func TestAttemptTrueAfterNATSCrash(t *testing.T) {
	np := testenv.NATSProc(t)
	rs := testenv.Redis(t)
	rec := workertest.NewRecorder(t)
	dir := t.TempDir()
	const jobs = 600
	file := func(admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
redis: { url: %q }
nats: { url: %q }
queues:
  - { name: crash, rate: 200/s, ack_wait: 2s, concurrency: 8, target: "POST %s/crash" }
`, freeAddr(t), admin, rs.URL(), np.URL, rec.URL)
	}
	in := start(t, dir, file(freeAddr(t)))
	submit := func(i int) int {
		resp, err := http.Post("http://"+in.listen+"/v1/queues/crash/jobs", "text/plain", strings.NewReader(fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// The queue's stream may come up just after the ingress is ready.
	testenv.WaitFor(t, 10*time.Second, "the first job accepted", func() bool { return submit(0) == http.StatusAccepted })
	for i := 1; i < jobs; i++ {
		if code := submit(i); code != http.StatusAccepted {
			t.Fatalf("submit %d: %d", i, code)
		}
	}
	for w := range 2 {
		path := filepath.Join(dir, fmt.Sprintf("worker%d.yaml", w))
		if err := os.WriteFile(path, []byte(file(freeAddr(t))), 0o644); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- Worker{ConfigPath: path, Logger: testLogger()}.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	rec.WaitCount(t, 30*time.Second, "a third of the jobs delivered", func(n int) bool { return n >= jobs/3 })
	np.Kill()
	np.Start()
	testenv.WaitFor(t, 60*time.Second, "every job delivered", func() bool { return rec.Distinct() >= jobs })

	last := map[string]int{}
	again := 0
	for _, a := range rec.Arrivals() {
		if prev, ok := last[a.ID]; ok {
			again++
			if a.Attempt <= prev {
				t.Errorf("job %s reached the upstream again with Sluice-Attempt %d after %d", a.ID, a.Attempt, prev)
			}
		}
		last[a.ID] = a.Attempt
	}
	t.Logf("%d jobs, %d deliveries, %d of them again", rec.Distinct(), rec.Count(), again)
}
