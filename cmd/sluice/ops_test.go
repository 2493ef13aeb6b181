package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// TestJobsAndTop: against a real ingress whose queue is paused with 5 jobs waiting, `sluice
// jobs` pages through them by cursor (each job once, in order), --all follows the cursor to
// the end, and `sluice top --frames 2` draws two frames of the queue table, the second after a
// clear-screen, and exits.
func TestJobsAndTop(t *testing.T) {
	rec := workertest.NewRecorder(t)
	listen, admin := ingress(t, fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
data_dir: DATA
upstream: %[1]s
queues:
  - { name: orders, rate: 20/s, target: "POST %[1]s/orders" }
`, rec.URL))
	if code, _, errOut := sluice(admin, nil, "pause", "orders"); code != 0 {
		t.Fatalf("pause: %s", errOut)
	}
	var ids []string
	for i := range 5 {
		ids = append(ids, submit(t, listen, "orders", fmt.Sprint("order ", i)))
	}
	code, out, errOut := sluice(admin, nil, "jobs", "orders", "--limit", "2")
	if code != 0 || !strings.Contains(out, ids[0]) || !strings.Contains(out, ids[1]) || strings.Contains(out, ids[2]) ||
		!strings.Contains(out, "more: sluice jobs orders --cursor ") {
		t.Fatalf("jobs --limit 2: %d %s %s", code, out, errOut)
	}
	cursor := strings.TrimSpace(out[strings.LastIndex(out, "--cursor ")+len("--cursor "):])
	_, out, _ = sluice(admin, nil, "jobs", "orders", "--limit", "2", "--cursor", cursor)
	if !strings.Contains(out, ids[2]) || !strings.Contains(out, ids[3]) || strings.Contains(out, ids[1]) {
		t.Errorf("the second page: %s", out)
	}
	_, out, _ = sluice(admin, nil, "jobs", "orders", "--limit", "2", "--all", "--state", "queued")
	for _, id := range ids {
		if strings.Count(out, id) != 1 {
			t.Errorf("--all lists %s %d times:\n%s", id, strings.Count(out, id), out)
		}
	}
	if code, _, errOut := sluice(admin, nil, "jobs", "orders", "--state", "bogus"); code != 1 || !strings.Contains(errOut, "state") {
		t.Errorf("a bad state: %d %s", code, errOut)
	}

	code, out, errOut = sluice(admin, nil, "top", "--frames", "2", "--every", "10ms")
	if code != 0 || strings.Count(out, "QUEUE") != 2 || strings.Count(out, "\x1b[2J") != 1 || !strings.Contains(out, "orders") {
		t.Fatalf("top --frames 2: %d %q %s", code, out, errOut)
	}
	if !strings.Contains(out, "yes") {
		t.Errorf("top does not show the pause:\n%s", out)
	}
}
