package app

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// answer is one HTTP exchange: its status, body and how long it took.
type answer struct {
	code int
	body string
	took time.Duration
}

func do(t *testing.T, method, url, body string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return answer{resp.StatusCode, string(b), time.Since(t0)}
}

// deferBudget is what the contract allows a deferral that cannot be stored to take for its 503.
const deferBudget = 250 * time.Millisecond

// An ingress whose NATS does not answer at start serves at once: /healthz, a /readyz that
// names the NATS URL it waits for, forwarded requests; deferrals and the job API answer 503
// within 250 ms. When nats-server starts on that URL, the same process starts deferring, no
// restart. (Before: Run waited in openQueues before it opened any listener.)
func TestIngressServesWhileNATSIsDown(t *testing.T) {
	ns := testenv.NATSProc(t)
	ns.Kill() // its port stays reserved: nothing listens there until Start
	up := workertest.NewRecorder(t)
	r := startWithin(t, t.TempDir(), fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
upstream: %s
nats: { url: %s }
queues:
  - name: orders
    rate: 1/h
    target: POST %s/jobs
rules:
  - name: orders
    match: { methods: [POST], path: /orders }
    action: enqueue
    queue: orders
`, up.URL, ns.URL, up.URL), 10*time.Second)

	if a := do(t, "GET", "http://"+r.admin+"/healthz", ""); a.code != http.StatusOK {
		t.Errorf("/healthz: %d %s", a.code, a.body)
	}
	// /readyz is 503 from the start; it names the URL once the first attempt to open the
	// queues failed ("not opened yet" before it, which a loaded machine can show for a while).
	var a answer
	testenv.WaitFor(t, 5*time.Second, "/readyz naming "+ns.URL, func() bool {
		a = do(t, "GET", "http://"+r.admin+"/readyz", "")
		if a.code != http.StatusServiceUnavailable {
			t.Fatalf("/readyz while NATS is down: %d %s; want 503", a.code, a.body)
		}
		return strings.Contains(a.body, "no NATS server answers at "+ns.URL)
	})
	if a := do(t, "GET", "http://"+r.listen+"/api/hello", ""); a.code != http.StatusOK {
		t.Errorf("a forwarded request while NATS is down: %d %s", a.code, a.body)
	}
	for _, c := range []struct{ method, path string }{
		{"POST", "/orders"},                // a deferral
		{"POST", "/v1/queues/orders/jobs"}, // the job API
		{"GET", "/v1/jobs/0193a7e0-0000-7000-8000-000000000000"},
	} {
		a := do(t, c.method, "http://"+r.listen+c.path, `{"item":"book"}`)
		if a.code != http.StatusServiceUnavailable || a.took > deferBudget {
			t.Errorf("%s %s while NATS is down: %d in %v; want 503 within %v: %s", c.method, c.path, a.code, a.took, deferBudget, a.body)
		}
	}

	ns.Start()
	testenv.WaitFor(t, 20*time.Second, "/readyz to answer 200 once NATS answers", func() bool {
		return do(t, "GET", "http://"+r.admin+"/readyz", "").code == http.StatusOK
	})
	if a := do(t, "POST", "http://"+r.listen+"/orders", `{"item":"book"}`); a.code != http.StatusAccepted {
		t.Errorf("a deferral once NATS answers: %d %s; want 202", a.code, a.body)
	}
	if a := do(t, "GET", "http://"+r.admin+"/v1/queues/orders", ""); a.code != http.StatusOK || !strings.Contains(a.body, `"depth":1`) {
		t.Errorf("the queue once NATS answers: %d %s; want depth 1", a.code, a.body)
	}
}

// A nats-server whose store fills up ("no space left on device", on a real filesystem: a
// tmpfs of 16 MiB, so the test needs root; JetStream's own max_file_store limit would answer
// "insufficient resources" instead, which is not what a full disk does). A lone nats-server
// keeps JetStream on, but the stream that failed to write keeps that error, its publishes
// unanswered, until JetStream starts again. Every deferral after the first that found it so
// answers 503 at once (before: 2 s each), /readyz says what happened and what to do (free
// space, restart nats-server), and after that the same ingress defers again, with the queue's
// depth true.
func TestIngressOnAFullNATSDisk(t *testing.T) {
	mnt := testenv.TmpFS(t, 16)
	ns := testenv.NATSProcIn(t, filepath.Join(mnt, "jetstream"))
	up := workertest.NewRecorder(t)
	r := startWithin(t, t.TempDir(), fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
upstream: %s
nats: { url: %s }
shutdown_timeout: 2s
queues:
  - name: orders
    rate: 1/h
    target: POST %s/jobs
    max_bytes: 4194304 # JetStream reserves it on a 16 MiB disk
`, up.URL, ns.URL, up.URL), 10*time.Second)
	testenv.WaitFor(t, 20*time.Second, "the queues to open", func() bool {
		return do(t, "GET", "http://"+r.admin+"/readyz", "").code == http.StatusOK
	})
	filler := testenv.Fill(t, filepath.Join(mnt, "filler"), 1024)

	body := strings.Repeat("x", 64<<10)
	accepted, failed, slow := 0, 0, 0
	for i := 0; i < 200 && failed < 8; i++ {
		a := do(t, "POST", "http://"+r.listen+"/v1/queues/orders/jobs", body)
		switch {
		case a.code == http.StatusAccepted:
			accepted++
		case a.code != http.StatusServiceUnavailable:
			t.Fatalf("job %d: %d %s; want 202 or 503", i, a.code, a.body)
		default:
			failed++
			if a.took > deferBudget {
				slow++
			}
		}
	}
	// The first 503 is caught in flight and waits for its publish timeout; at most one trial
	// (250 ms later) may wait as long.
	if slow > 2 {
		t.Errorf("%d of %d 503s took longer than %v; want at most 2", slow, failed, deferBudget)
	}
	if failed == 0 {
		t.Fatalf("%d jobs accepted and none refused: the store never filled", accepted)
	}
	// /readyz answers from checks run every 0.5 s in the background: it says so by the next.
	var a answer
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		a = do(t, "GET", "http://"+r.admin+"/readyz", "")
		if a.code == http.StatusServiceUnavailable && strings.Contains(a.body, "restart nats-server") || time.Now().After(deadline) {
			break
		}
	}
	if a.code != http.StatusServiceUnavailable || !strings.Contains(a.body, "restart nats-server") {
		t.Errorf("/readyz with the NATS disk full: %d %s; want 503 saying to restart nats-server", a.code, a.body)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	ns.Kill()
	ns.Start()
	testenv.WaitFor(t, 20*time.Second, "/readyz to answer 200 after space was freed and nats-server restarted", func() bool {
		return do(t, "GET", "http://"+r.admin+"/readyz", "").code == http.StatusOK
	})
	testenv.WaitFor(t, 5*time.Second, "a deferral to be accepted again", func() bool {
		return do(t, "POST", "http://"+r.listen+"/v1/queues/orders/jobs", "{}").code == http.StatusAccepted
	})
	want := fmt.Sprintf(`"depth":%d,`, accepted+1)
	if a := do(t, "GET", "http://"+r.admin+"/v1/queues/orders", ""); !strings.Contains(a.body, want) {
		t.Errorf("the queue after recovery: %s; want %s (%d accepted before the disk filled, 1 after)", a.body, want, accepted)
	}
	t.Logf("%d jobs accepted before the disk filled, %d refused", accepted, failed)
}
