package app

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// queueDepth reads queue q's depth from the admin API at admin; -1 while it cannot (NATS
// reconnecting).
func queueDepth(t *testing.T, admin, q string) int {
	t.Helper()
	a := do(t, "GET", "http://"+admin+"/v1/queues/"+q, "")
	var info struct{ Depth int }
	if a.code != 200 || json.Unmarshal([]byte(a.body), &info) != nil {
		return -1
	}
	return info.Depth
}

// streamMsgs reads the message count of stream name on the NATS at url: what the history and
// KEDA's input count as the queue's depth (queue.Counts), read without the admin API's queue
// read, which removes leftovers itself.
func streamMsgs(t *testing.T, url, name string) int {
	t.Helper()
	nc := testenv.Connect(t, url)
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, name)
	if err != nil {
		return -1
	}
	si, err := st.Info(ctx)
	if err != nil {
		return -1
	}
	return int(si.State.Msgs)
}

// A worker drains a queue while the disk under nats-server fills: its acknowledgements reach
// the consumer, but the stream, which cannot write, keeps the jobs (leftovers), which depth
// does not count. Once space is
// freed and nats-server restarted (the action /readyz names), the ingress defers again and the
// worker removes them: the stream holds only the jobs really waiting (none, every job accepted
// was delivered), without any admin read; then, with the worker stopped, 5 jobs accepted make
// depth 5, no more.
func TestDepthTrueAfterAFullNATSDisk(t *testing.T) {
	mnt := testenv.TmpFS(t, 16)
	ns := testenv.NATSProcIn(t, filepath.Join(mnt, "jetstream"))
	rs := testenv.Redis(t)
	up := workertest.NewRecorder(t)
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
upstream: %s
redis: { url: %q }
nats: { url: %s }
shutdown_timeout: 2s
queues:
  - name: orders
    rate: 40/s
    target: POST %s/jobs
    max_bytes: 4194304 # JetStream reserves it on a 16 MiB disk
`, up.URL, rs.URL(), ns.URL, up.URL)
	r := startWithin(t, t.TempDir(), cfg, 10*time.Second)
	testenv.WaitFor(t, 20*time.Second, "the queues to open", func() bool {
		return do(t, "GET", "http://"+r.admin+"/readyz", "").code == 200
	})
	stopWorker := runWorker(t, t.TempDir(), cfg)
	filler := testenv.Fill(t, filepath.Join(mnt, "filler"), 1024)

	body := strings.Repeat("x", 64<<10)
	accepted, failed := 0, 0
	for i := 0; i < 400 && failed < 8; i++ {
		a := do(t, "POST", "http://"+r.listen+"/v1/queues/orders/jobs", body)
		switch a.code {
		case 202:
			accepted++
		case 503:
			failed++
		default:
			t.Fatalf("job %d: %d %s; want 202 or 503", i, a.code, a.body)
		}
	}
	if failed == 0 {
		t.Fatalf("%d jobs accepted and none refused: the store never filled", accepted)
	}
	// The worker goes on delivering what the stream holds: wait until it has them all.
	up.WaitCount(t, 30*time.Second, "every accepted job delivered while the disk is full", func(int) bool {
		return up.Distinct() >= accepted
	})
	stuck := streamMsgs(t, ns.URL, "SLUICE_Q_orders")
	t.Logf("disk full: %d accepted, %d refused, %d delivered; %d left in the stream", accepted, failed, up.Distinct(), stuck)
	testenv.WaitFor(t, 5*time.Second, "depth 0 while the disk is full: every job was delivered", func() bool {
		return queueDepth(t, r.admin, "orders") == 0
	})

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	ns.Kill()
	ns.Start() // returns once JetStream answers
	t0 := time.Now()
	testenv.WaitFor(t, 20*time.Second, "a deferral to be accepted after nats-server restarted", func() bool {
		return do(t, "POST", "http://"+r.listen+"/v1/queues/orders/jobs", "{}").code == 202
	})
	deferring := time.Since(t0)
	testenv.WaitFor(t, 20*time.Second, "the worker to remove the leftovers and deliver the new job", func() bool {
		return streamMsgs(t, ns.URL, "SLUICE_Q_orders") == 0 && up.Distinct() == accepted+1
	})
	t.Logf("after nats-server restarted: deferring again in %v; the %d leftovers removed and the new job delivered in %v",
		deferring.Round(time.Millisecond), stuck, time.Since(t0).Round(time.Millisecond))
	testenv.WaitFor(t, 20*time.Second, "/readyz to answer 200 after nats-server restarted", func() bool {
		return do(t, "GET", "http://"+r.admin+"/readyz", "").code == 200
	})
	if d := queueDepth(t, r.admin, "orders"); d != 0 {
		t.Errorf("depth %d with every accepted job delivered; want 0", d)
	}

	// With the worker stopped, 5 jobs accepted are 5 waiting, no more.
	stopWorker()
	delivered := up.Count()
	for i := range 5 {
		if a := do(t, "POST", "http://"+r.listen+"/v1/queues/orders/jobs", "{}"); a.code != 202 {
			t.Fatalf("job %d after recovery: %d %s; want 202", i, a.code, a.body)
		}
	}
	if d := queueDepth(t, r.admin, "orders"); d != 5 || up.Count() != delivered {
		t.Errorf("depth %d with 5 jobs accepted and no worker (%d delivered since); want 5, none delivered",
			d, up.Count()-delivered)
	}
	if n := up.Count(); n != up.Distinct() {
		t.Logf("%d requests for %d jobs", n, up.Distinct())
	}
}

// The quickstart's embedded JetStream on a disk that fills: deferrals answer 503, /readyz says
// to free space under data_dir and restart the ingress, depth counts only the jobs really
// waiting, and once space is freed /readyz still says to restart (the stream keeps its write
// error until JetStream starts again; see embeddedstore.go for why it is not restarted in place).
func TestEmbeddedFullDiskNamesTheFix(t *testing.T) {
	mnt := testenv.TmpFS(t, 16)
	up := workertest.NewRecorder(t)
	r := startWithin(t, t.TempDir(), fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
upstream: %s
data_dir: %s
shutdown_timeout: 2s
queues:
  - name: orders
    rate: 40/s
    target: POST %s/jobs
    max_bytes: 4194304
`, up.URL, filepath.Join(mnt, "data"), up.URL), 10*time.Second)
	filler := testenv.Fill(t, filepath.Join(mnt, "filler"), 1024)

	body := strings.Repeat("x", 64<<10)
	accepted, failed := 0, 0
	for i := 0; i < 400 && failed < 8; i++ {
		a := do(t, "POST", "http://"+r.listen+"/v1/queues/orders/jobs", body)
		switch a.code {
		case 202:
			accepted++
		case 503:
			failed++
		default:
			t.Fatalf("job %d: %d %s; want 202 or 503", i, a.code, a.body)
		}
	}
	if failed == 0 {
		t.Fatalf("%d jobs accepted and none refused: the store never filled", accepted)
	}
	up.WaitCount(t, 30*time.Second, "every accepted job delivered while the disk is full", func(int) bool {
		return up.Distinct() >= accepted
	})
	var a answer
	testenv.WaitFor(t, 5*time.Second, "/readyz to name the fix", func() bool {
		a = do(t, "GET", "http://"+r.admin+"/readyz", "")
		return a.code == 503 && strings.Contains(a.body, "free space under data_dir")
	})
	t.Logf("disk full: %d accepted, %d refused, %d delivered", accepted, failed, up.Distinct())
	testenv.WaitFor(t, 5*time.Second, "depth 0 while the disk is full: every job was delivered", func() bool {
		return queueDepth(t, r.admin, "orders") == 0
	})

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "/readyz to say restart once there is room", func() bool {
		a = do(t, "GET", "http://"+r.admin+"/readyz", "")
		return a.code == 503 && strings.Contains(a.body, "restart the ingress")
	})
	if code := do(t, "POST", "http://"+r.listen+"/v1/queues/orders/jobs", "{}").code; code != 503 {
		t.Errorf("a deferral after space was freed, before a restart: %d, want 503 (never a 202 that is not stored)", code)
	}
}

// A delivery whose upstream answers while nats-server is down (killed with SIGKILL, restarted
// after the answer): the worker's outbox records the job succeeded once NATS is back, but its
// ack was lost, so JetStream would keep the job in flight for its ack_wait (an hour here).
// The worker removes it as a leftover: depth 0 within seconds, the job delivered once. Both
// ways a plain queue keeps its jobs: in a shared stream (the default) and in its own.
func TestDepthTrueAfterAnAckLostInANATSCrash(t *testing.T) {
	for _, mode := range []struct{ name, nats, stream string }{
		{"shared", "", jobStream("orders")},
		{"own", "shared_streams: 0, ", "SLUICE_Q_orders"},
	} {
		t.Run(mode.name, func(t *testing.T) { ackLostInANATSCrash(t, mode.nats, mode.stream) })
	}
}

// ackLostInANATSCrash is TestDepthTrueAfterAnAckLostInANATSCrash with nats (keys of the nats
// section before its url), the queue's jobs in stream.
func ackLostInANATSCrash(t *testing.T, nats, stream string) {
	np := testenv.NATSProc(t)
	rs := testenv.Redis(t)
	up := workertest.NewRecorder(t)
	release := make(chan struct{})
	up.Respond(func(workertest.Arrival, int) workertest.Reply { return workertest.Reply{Block: release} })
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
redis: { url: %q }
nats: { %surl: %s }
shutdown_timeout: 2s
queues:
  - { name: orders, rate: 10/s, ack_wait: 1h, timeout: 30s, target: "POST %s/jobs" }
`, rs.URL(), nats, np.URL, up.URL)
	r := startWithin(t, t.TempDir(), cfg, 10*time.Second)
	waitReady(t, r)
	runWorker(t, t.TempDir(), cfg)
	a := do(t, "POST", "http://"+r.listen+"/v1/queues/orders/jobs", "{}")
	if a.code != 202 {
		t.Fatalf("submit: %d %s", a.code, a.body)
	}
	up.WaitCount(t, 20*time.Second, "the job at the upstream", func(n int) bool { return n == 1 })
	np.Kill()
	close(release) // the upstream answers 200 while NATS is down
	np.Start()
	t0 := time.Now()
	testenv.WaitFor(t, 20*time.Second, "the job gone from the stream", func() bool {
		return streamMsgs(t, np.URL, stream) == 0
	})
	gone := time.Since(t0)
	if d := queueDepth(t, r.admin, "orders"); d != 0 {
		t.Errorf("depth %d; want 0", d)
	}
	if n := up.Count(); n != 1 {
		t.Errorf("the upstream saw the job %d times; want once", n)
	}
	t.Logf("the job left the stream %v after nats-server restarted", gone.Round(time.Millisecond))
}
