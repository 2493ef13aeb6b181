package queue_test

import (
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/queue"
)

// TestSharedCountsListNoSubjects: the periodic passes over the shared streams — the ingress's
// Counts (the history, every minute) and the workers' Waiting (every 5 s) — count the jobs of
// queues without a consumer without listing a shared stream's subjects (one per job, built by
// nats-server under the stream's lock: 1.1-1.7 s at 130 000 jobs, the served queues' pulls on
// that stream waiting meanwhile). A backlog of a queue no worker serves is counted from its
// ledger's tickets; a served queue before its first consumer too, and it is still found
// waiting. SLUICE_UNSERVED_JOBS sets the backlog (a measurement: the test logs how long each
// Counts took and the longest a store in that stream waited meanwhile).
func TestSharedCountsListNoSubjects(t *testing.T) {
	backlog := 400
	if n, err := strconv.Atoi(os.Getenv("SLUICE_UNSERVED_JOBS")); err == nil && n > 0 {
		backlog = n
	}
	// pub knows every queue, as an ingress does; w is a worker whose config lacks "unserved".
	pub := setup(t, queue.Options{SharedStreams: 1}, queue.Spec{Name: "a"}, queue.Spec{Name: "b"}, queue.Spec{Name: "unserved"})
	w := setupURL(t, pub.url, pub.opts, queue.Spec{Name: "a"}, queue.Spec{Name: "b"})
	job := func(q string) *queue.Job {
		return &queue.Job{Queue: q, Method: http.MethodPost, Path: "/x", Body: []byte("x")}
	}
	var wg sync.WaitGroup
	var failed atomic.Bool
	for p := range 8 {
		wg.Go(func() {
			for i := p; i < backlog; i += 8 {
				if _, err := pub.q.Publish(pub.ctx, job("unserved")); err != nil {
					failed.Store(true)
					return
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() {
		t.Fatal("publishing the unserved backlog failed")
	}
	for range 5 {
		w.publish(job("a"))
	}
	w.consumer("a") // a is served: its jobs are its consumer's
	w.publish(job("b"))

	// stall measures the longest a store in the stream (a job of a, which takes the stream's
	// lock) waits while f runs, and how long f takes.
	stall := func(f func()) (took, longest time.Duration) {
		done := make(chan struct{})
		var probe sync.WaitGroup
		probe.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				start := time.Now()
				if _, err := pub.js.Publish(pub.ctx, pub.prefix+".j.0.a.probe", []byte("x")); err == nil {
					longest = max(longest, time.Since(start))
				}
			}
		})
		start := time.Now()
		f()
		took = time.Since(start)
		close(done)
		probe.Wait()
		return took, longest
	}
	counts := func(want map[string]uint64) {
		t.Helper()
		var got map[string]queue.Counts
		var err error
		took, longest := stall(func() { got, err = pub.q.Counts(pub.ctx, false) })
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("Counts beside %d unserved jobs: %v, the longest store meanwhile %v",
			backlog, took, longest)
		for name, n := range want {
			if got[name].Depth != n && (name != "a" || got[name].Depth < n) { // a: and the probes
				t.Fatalf("Counts: %s at %d; want %d (%+v)", name, got[name].Depth, n, got)
			}
		}
		if r := queue.FormerProbes(pub.q); r != 0 {
			t.Fatalf("the ingress's Counts read %d jobs of former streams; want none", r)
		}
	}
	counts(map[string]uint64{"unserved": uint64(backlog), "a": 5, "b": 1})
	pub.publish(job("unserved")) // the unowned count moves
	counts(map[string]uint64{"unserved": uint64(backlog) + 1, "a": 5, "b": 1})

	waiting, _, err := w.q.Waiting(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if waiting["a"] < 5 || waiting["b"] != 1 || waiting["unserved"] != 0 {
		t.Fatalf("the worker's Waiting: %v; want a: 5 and the probes, b: 1 (no consumer yet), unserved not its", waiting)
	}
	if r := queue.FormerProbes(w.q); r != 0 {
		t.Fatalf("the worker's Waiting read %d jobs of former streams; want none", r)
	}
}

// TestSharedLeftTicketHidesNoJob: a ticket without its job (a worker that died between the
// job's acknowledgement and the ticket's release) counts its queue a job too many until the
// ledger sweep, but never hides another queue's job in the same stream from the scan.
func TestSharedLeftTicketHidesNoJob(t *testing.T) {
	b := setup(t, queue.Options{SharedStreams: 1}, queue.Spec{Name: "x"}, queue.Spec{Name: "y"})
	job := func(q string) *queue.Job {
		return &queue.Job{Queue: q, Method: http.MethodPost, Path: "/x", Body: []byte("x")}
	}
	b.publish(job("x"))
	st, err := b.js.Stream(b.ctx, b.prefix+"_J_0")
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetMsg(b.ctx, 1, jetstream.WithGetMsgSubject(b.prefix+".j.0.x.>"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteMsg(b.ctx, m.Sequence); err != nil { // x's job gone, its ticket left
		t.Fatal(err)
	}
	b.publish(job("y"))
	for range 20 { // the map's order varies: every order must count y
		waiting, _, err := b.q.Waiting(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if waiting["y"] != 1 {
			t.Fatalf("waiting %v; want y at 1 beside x's ticket without a job", waiting)
		}
	}
}

// A job without a ticket (as a replayed dead letter is) of a queue without a consumer, stored
// while no worker ran (its bell lost), is found by the sweep all the same: the tickets leave
// it unexplained, and the queue is read for it.
func TestSharedUnticketedJobFound(t *testing.T) {
	b := setup(t, queue.Options{SharedStreams: 1}, queue.Spec{Name: "x"}, queue.Spec{Name: "y"})
	b.publish(&queue.Job{Queue: "y", Method: http.MethodPost, Path: "/x", Body: []byte("y")})
	ledger, err := b.js.Stream(b.ctx, b.prefix+"_L_y")
	if err != nil {
		t.Fatal(err)
	}
	if err := ledger.Purge(b.ctx); err != nil { // y's job stays, its ticket gone
		t.Fatal(err)
	}
	waiting, _, err := b.q.Waiting(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if waiting["y"] < 1 || waiting["x"] != 0 {
		t.Fatalf("waiting %v; want y found (a job without a ticket), x not", waiting)
	}
}

// A process without shared streams reads the shared streams another configuration left (its
// queues' former streams) beside a queue it does not provision: it counts, and does not fail.
func TestUnsharedScanBesideForeignBacklog(t *testing.T) {
	pub := setup(t, queue.Options{SharedStreams: 1}, queue.Spec{Name: "a"}, queue.Spec{Name: "unserved"})
	pub.publish(&queue.Job{Queue: "unserved", Method: http.MethodPost, Path: "/x", Body: []byte("x")})
	pub.publish(&queue.Job{Queue: "a", Method: http.MethodPost, Path: "/x", Body: []byte("x")})
	own := pub.opts
	own.SharedStreams = 0
	b := setupURL(t, pub.url, own, queue.Spec{Name: "a"})
	counts, err := b.q.Counts(b.ctx, true)
	if err != nil || counts["a"].Depth != 1 {
		t.Fatalf("counts %+v, %v; want a at 1 (its job in its former shared stream)", counts, err)
	}
	if _, _, err := b.q.Waiting(b.ctx); err != nil {
		t.Fatal(err)
	}
}
