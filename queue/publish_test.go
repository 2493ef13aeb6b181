package queue_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

func allBytes() []byte {
	b := make([]byte, 0, 512)
	for i := range 256 {
		b = append(b, byte(i))
	}
	for i := 255; i >= 0; i-- { // and every byte after every other value class
		b = append(b, byte(i))
	}
	return b
}

func TestPublishConsumeRoundTrip(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "orders"})
	created := time.Date(2025, 3, 14, 15, 9, 26, 123456789, time.UTC)
	in := &queue.Job{
		Queue:  "orders",
		Method: http.MethodPost,
		Path:   "/api/orders?x=1&y=%20z&q=a+b",
		Header: http.Header{
			"Content-Type": {"application/octet-stream"},
			"X-Multi":      {"one", "two"},
			"X-Odd":        {`quote " backslash \ tab	 unicode ünï €  trailing `},
		},
		Body:      allBytes(),
		CreatedAt: created,
	}
	r := b.publish(in)
	if r.Replayed || r.ID == "" || in.ID != r.ID {
		t.Fatalf("receipt %+v, job id %q", r, in.ID)
	}
	st, err := b.q.Status(b.ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != queue.StateQueued || st.Queue != "orders" || !st.CreatedAt.Equal(created) || st.Attempts != 0 {
		t.Fatalf("status after publish: %+v", st)
	}

	m := b.fetchOne(b.consumer("orders"), 5*time.Second)
	got := m.Job
	if !bytes.Equal(got.Body, in.Body) {
		t.Fatalf("body not byte-exact:\n got %x\nwant %x", got.Body, in.Body)
	}
	if got.ID != r.ID || got.Queue != "orders" || got.Method != in.Method || got.Path != in.Path ||
		got.Direct || !got.CreatedAt.Equal(created) {
		t.Fatalf("job: got %+v", got)
	}
	if fmt.Sprint(got.Header) != fmt.Sprint(in.Header) {
		t.Fatalf("header: got %q want %q", got.Header, in.Header)
	}
	if m.Delivered != 1 || m.Seq != 1 {
		t.Fatalf("delivered %d seq %d, want 1 1", m.Delivered, m.Seq)
	}
	if err := m.Ack(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Ack(b.ctx); err == nil {
		t.Fatal("second ack of one delivery succeeded")
	}
	if d := b.depth("orders"); d != 0 {
		t.Fatalf("depth after ack = %d, want 0 (work queue)", d)
	}
}

// Header values that are not valid UTF-8 (obs-text, e.g. Latin-1) replay byte-exact too.
func TestPublishNonUTF8Header(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q"})
	h := http.Header{"X-Latin1": {"caf\xe9"}, "X-Plain": {"ok", ""}}
	b.publish(&queue.Job{Queue: "q", Method: "GET", Path: "/", Header: h})
	m := b.fetchOne(b.consumer("q"), 5*time.Second)
	if fmt.Sprintf("%q", m.Job.Header) != fmt.Sprintf("%q", h) {
		t.Fatalf("header: got %q want %q", m.Job.Header, h)
	}
}

func TestPublishDirectEmptyBody(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q"})
	r := b.publish(&queue.Job{Queue: "q", Direct: true})
	m := b.fetchOne(b.consumer("q"), 5*time.Second)
	if m.Job.ID != r.ID || !m.Job.Direct || m.Job.Body == nil || len(m.Job.Body) != 0 || m.Job.Method != "" {
		t.Fatalf("direct job: %+v", m.Job)
	}
}

func TestJobID(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "orders"})
	uuidRE := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[78][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	a := b.q.JobID("orders", "", "key-1")
	for _, id := range []string{a, queue.NewJobID("orders"), b.q.JobID("orders", "t1", "key-2")} {
		if !uuidRE.MatchString(id) {
			t.Fatalf("id %q is not a v7/v8 UUID", id)
		}
	}
	if b.q.JobID("orders", "", "key-1") != a {
		t.Fatal("keyed id not deterministic")
	}
	for _, other := range []string{
		b.q.JobID("orders", "", "key-2"), b.q.JobID("orders2", "", "key-1"),
		b.q.JobID("orders", "", "key-1 "), b.q.JobID("ord", "", "erskey-1"),
		b.q.JobID("orders", "t1", "key-1"), b.q.JobID("orders", "t", "1key-1"),
	} {
		if other == a {
			t.Fatalf("id collision: %q", other)
		}
	}
	if id1, id2 := queue.NewJobID("q"), queue.NewJobID("q"); id1 == id2 {
		t.Fatalf("random ids repeat: %s", id1)
	}
}

// TestJobIDSecret checks that keyed ids depend on a secret: every Queues on one prefix shares
// the stored one, a given IDSecret replaces it, and a short one is refused.
func TestJobIDSecret(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "orders"})
	again, err := queue.New(b.ctx, b.js, b.opts)
	if err != nil {
		t.Fatal(err)
	}
	if again.JobID("orders", "", "k") != b.q.JobID("orders", "", "k") {
		t.Fatal("two processes on one prefix derive different ids for one key")
	}
	opts := b.opts
	opts.IDSecret = []byte("another secret, 32 bytes long..")
	other, err := queue.New(b.ctx, b.js, opts)
	if err != nil {
		t.Fatal(err)
	}
	if other.JobID("orders", "", "k") == b.q.JobID("orders", "", "k") {
		t.Fatal("the id does not depend on the secret")
	}
	opts.IDSecret = []byte("short")
	if _, err := queue.New(b.ctx, b.js, opts); err == nil {
		t.Fatal("a 5-byte IDSecret was accepted")
	}
}

// TestTenantIDSecret: a tenant id is keyed with the id secret. Two Queues on one prefix share it
// and agree; one with another secret derives another id for the same value; neither is the
// unsalted SHA-256 the ids were before (which anyone could compute from an API key), and two
// values never share an id.
func TestTenantIDSecret(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "orders"})
	again, err := queue.New(b.ctx, b.js, b.opts)
	if err != nil {
		t.Fatal(err)
	}
	key := []byte("sk_live_customer_1")
	id := b.q.TenantID(key)
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(id) {
		t.Fatalf("tenant id %q is not 32 hex digits", id)
	}
	if again.TenantID(key) != id {
		t.Fatal("two processes on one prefix derive different tenant ids for one value")
	}
	opts := b.opts
	opts.IDSecret = []byte("another secret, 32 bytes long..")
	other, err := queue.New(b.ctx, b.js, opts)
	if err != nil {
		t.Fatal(err)
	}
	if other.TenantID(key) == id {
		t.Fatal("the tenant id does not depend on the secret")
	}
	sum := sha256.Sum256(key)
	if unsalted := hex.EncodeToString(sum[:16]); id == unsalted || other.TenantID(key) == unsalted {
		t.Fatal("the tenant id is the unsalted SHA-256 of the value")
	}
	if b.q.TenantID([]byte("sk_live_customer_2")) == id || b.q.TenantID(nil) == id {
		t.Fatal("two values share a tenant id")
	}
}

// TestIdempotencyKeyPerTenant: two tenants' jobs with one Idempotency-Key are two jobs, even
// with different bodies (no 422 that tells one tenant the other's key exists), and each
// status carries its tenant.
func TestIdempotencyKeyPerTenant(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "orders"})
	ra := b.publish(&queue.Job{Queue: "orders", Method: "POST", Path: "/o", Body: []byte("a"), IdempotencyKey: "order-1001", Tenant: "A"})
	rb := b.publish(&queue.Job{Queue: "orders", Method: "POST", Path: "/o", Body: []byte("b"), IdempotencyKey: "order-1001", Tenant: "B"})
	if ra.ID == rb.ID || rb.Replayed {
		t.Fatalf("tenant B's job %+v replayed tenant A's %+v", rb, ra)
	}
	for id, tenant := range map[string]string{ra.ID: "A", rb.ID: "B"} {
		st, err := b.q.Status(b.ctx, id)
		if err != nil || st.Tenant != tenant {
			t.Fatalf("Status(%s) = %+v, %v; want tenant %s", id, st, err, tenant)
		}
	}
	// Unkeyed jobs carry their tenant in the message until a worker records them.
	r := b.publish(&queue.Job{Queue: "orders", Method: "POST", Path: "/o", Tenant: "C"})
	if st, err := b.q.Status(b.ctx, r.ID); err != nil || st.Tenant != "C" {
		t.Fatalf("Status of an unkeyed job = %+v, %v; want tenant C", st, err)
	}
}

func TestIdempotentRepeat(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "orders"}, queue.Spec{Name: "other"})
	job := func() *queue.Job {
		return &queue.Job{Queue: "orders", Method: "POST", Path: "/api/orders", Body: []byte(`{"n":1}`), IdempotencyKey: "k1"}
	}
	first := b.publish(job())
	if first.Replayed || first.ID != b.q.JobID("orders", "", "k1") {
		t.Fatalf("first: %+v", first)
	}
	second := b.publish(job())
	if !second.Replayed || second.ID != first.ID {
		t.Fatalf("second: %+v, first %+v", second, first)
	}
	if d := b.depth("orders"); d != 1 {
		t.Fatalf("depth %d after a repeat, want 1", d)
	}

	// The same key for a different request is refused, and enqueues nothing.
	changed := job()
	changed.Body = []byte(`{"n":2}`)
	_, err := b.q.Publish(b.ctx, changed)
	wantErr(t, err, queue.ErrIdempotencyMismatch)

	// The same key on another queue is another job.
	o := b.publish(&queue.Job{Queue: "other", Body: []byte(`{"n":1}`), IdempotencyKey: "k1"})
	if o.Replayed || o.ID == first.ID {
		t.Fatalf("other queue: %+v", o)
	}
	if d := b.depth("orders"); d != 1 {
		t.Fatalf("depth %d, want 1", d)
	}
}

// TestIdempotentConcurrentMismatch publishes one key concurrently with two different bodies:
// every publish whose body is not the stored job's must be refused with
// ErrIdempotencyMismatch, never answered "replayed". Before, the losers that passed the record
// check before any record existed were told their job was replayed (77 of 120 in a run).
func TestIdempotentConcurrentMismatch(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "orders"})
	const n = 24
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		replayed = map[string]int{}
		fresh    = map[string]int{}
		mismatch int
		start    = make(chan struct{})
		failures []error
	)
	for i := range n {
		body := []string{"a", "b"}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := b.q.Publish(b.ctx, &queue.Job{Queue: "orders", Body: []byte(body), IdempotencyKey: "race-mismatch"})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, queue.ErrIdempotencyMismatch):
				mismatch++
			case err != nil:
				failures = append(failures, err)
			case r.Replayed:
				replayed[body]++
			default:
				fresh[body]++
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatal(failures)
	}
	if len(fresh) != 1 {
		t.Fatalf("fresh publishes %v, want exactly one", fresh)
	}
	var winner string
	for body := range fresh {
		winner = body
	}
	if len(replayed) != 1 || replayed[winner] != n/2-1 || mismatch != n/2 {
		t.Fatalf("winner %q; replayed %v, %d mismatches: want every other body refused, the same body replayed", winner, replayed, mismatch)
	}
}

func TestIdempotentConcurrent(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "orders"})
	const n = 16
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		fresh    int
		ids      = map[string]bool{}
		start    = make(chan struct{})
		failures []error
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := b.q.Publish(b.ctx, &queue.Job{Queue: "orders", Body: []byte("same"), IdempotencyKey: "race"})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures = append(failures, err)
				return
			}
			ids[r.ID] = true
			if !r.Replayed {
				fresh++
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatal(failures)
	}
	if fresh != 1 || len(ids) != 1 {
		t.Fatalf("%d publishes not replayed, %d ids; want exactly 1 and 1", fresh, len(ids))
	}
	if d := b.depth("orders"); d != 1 {
		t.Fatalf("depth %d, want 1", d)
	}
}

// The status entry, not JetStream's duplicate window, is what makes an Idempotency-Key hold for
// hours: with a 100ms stream window, a repeat after the window still enqueues nothing.
func TestIdempotentRepeatAfterStreamWindow(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "orders", StreamDuplicates: 100 * time.Millisecond})
	first := b.publish(&queue.Job{Queue: "orders", Body: []byte("x"), IdempotencyKey: "late"})

	// Wait until the stream's window has passed: a probe id published after the job stops being
	// a duplicate only once ids as old as the job's have been forgotten.
	probe := func() bool {
		ack, err := b.js.Publish(b.ctx, b.subject("orders"), []byte("probe"), jetstream.WithMsgID("probe"))
		if err != nil {
			t.Fatal(err)
		}
		return !ack.Duplicate
	}
	if !probe() {
		t.Fatal("first probe was a duplicate")
	}
	testenv.WaitFor(t, 10*time.Second, "stream duplicate window to pass", probe)
	before := b.depth("orders") // the job and two probes

	again, err := b.q.Publish(b.ctx, &queue.Job{Queue: "orders", Body: []byte("x"), IdempotencyKey: "late"})
	if err != nil {
		t.Fatal(err)
	}
	if !again.Replayed || again.ID != first.ID {
		t.Fatalf("repeat after stream window: %+v, first %+v", again, first)
	}
	if d := b.depth("orders"); d != before {
		t.Fatalf("depth %d after repeat, want %d", d, before)
	}
	// Control: JetStream alone would have stored the repeat.
	ack, err := b.js.Publish(b.ctx, b.subject("orders"), []byte("x"), jetstream.WithMsgID(first.ID))
	if err != nil || ack.Duplicate {
		t.Fatalf("control publish with the job's id: ack %+v err %v; want a new message", ack, err)
	}
}

func TestPublishErrors(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "small", MaxBodyBytes: 10})
	_, err := b.q.Publish(b.ctx, &queue.Job{Queue: "nope"})
	wantErr(t, err, queue.ErrUnknownQueue)

	_, err = b.q.Publish(b.ctx, &queue.Job{Queue: "small", Body: make([]byte, 11)})
	wantErr(t, err, queue.ErrTooLarge)
	b.publish(&queue.Job{Queue: "small", Body: make([]byte, 10)})

	// Beyond the server's max_payload (1 MiB) with no limit of the queue's own.
	if err := b.q.Provision(b.ctx, []queue.Spec{{Name: "small"}}); err != nil {
		t.Fatal(err)
	}
	big := &queue.Job{Queue: "small", Body: make([]byte, 2<<20)}
	_, err = b.q.Publish(b.ctx, big)
	wantErr(t, err, queue.ErrTooLarge)
	if _, err := b.q.Status(b.ctx, big.ID); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("status of a refused job: %v, want ErrNotFound", err)
	}

	_, err = b.q.Publish(b.ctx, &queue.Job{Queue: "small", ID: "bad.id"})
	if err == nil {
		t.Fatal("publish with an id that is not a subject token succeeded")
	}
}

func TestFullAtMaxDepth(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "tiny", MaxDepth: 3})
	for range 3 {
		b.publish(&queue.Job{Queue: "tiny", Body: []byte("x")})
	}
	refused := &queue.Job{Queue: "tiny", Body: []byte("x"), IdempotencyKey: "k"}
	_, err := b.q.Publish(b.ctx, refused)
	wantErr(t, err, queue.ErrFull)
	if _, err := b.q.Status(b.ctx, refused.ID); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("a refused job has a status: %v", err)
	}
	// In-flight jobs count too; once one is acked there is room again.
	m := b.fetchOne(b.consumer("tiny"), 5*time.Second)
	_, err = b.q.Publish(b.ctx, &queue.Job{Queue: "tiny"})
	wantErr(t, err, queue.ErrFull)
	if err := m.Ack(b.ctx); err != nil {
		t.Fatal(err)
	}
	// The acked job's ticket is released in the background (ledger.go): room comes back
	// within moments, and the same key is then accepted, not replayed.
	var r queue.Receipt
	testenv.WaitFor(t, 5*time.Second, "room once the acked job's ticket is released", func() bool {
		r, err = b.q.Publish(b.ctx, refused)
		return !errors.Is(err, queue.ErrFull)
	})
	if err != nil || r.Replayed {
		t.Fatalf("the same key after room came back: %+v, %v; want accepted, not a replay", r, err)
	}
}

// nats-server #4771: a work-queue stream with DiscardNew, MaxMsgs and a small MaxBytes
// acknowledged messages it then dropped. Every Publish that returned nil must be in the stream,
// whichever limit refuses, and while workers remove jobs concurrently.
func TestFullNoSilentLoss(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "wq", MaxDepth: 25, MaxBytes: 24 << 10})
	var (
		mu       sync.Mutex
		accepted = map[string]bool{}
		seen     = map[string]int{}
		refusals = map[string]int{}
	)
	run := func(n int, size func(*rand.Rand) int) {
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(w), uint64(n)))
				for range n / 4 {
					job := &queue.Job{Queue: "wq", Body: make([]byte, size(rng))}
					_, err := b.q.Publish(b.ctx, job)
					mu.Lock()
					switch {
					case err == nil:
						accepted[job.ID] = true
					case errors.Is(err, queue.ErrFull) && strings.Contains(err.Error(), "maximum messages"):
						refusals["msgs"]++
					case errors.Is(err, queue.ErrFull) && strings.Contains(err.Error(), "maximum bytes"):
						refusals["bytes"]++
					default:
						t.Errorf("publish: %v", err)
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	check := func(phase string) {
		t.Helper()
		mu.Lock()
		want := len(accepted) - len(seen)
		mu.Unlock()
		if d := b.depth("wq"); d != uint64(want) {
			t.Fatalf("%s: stream holds %d jobs, %d accepted and not yet consumed", phase, d, want)
		}
		for id, n := range b.drain("wq") {
			seen[id] += n
		}
	}

	run(200, func(*rand.Rand) int { return 100 }) // small jobs: MaxMsgs refuses
	check("max msgs")
	run(200, func(*rand.Rand) int { return 3000 }) // large jobs: MaxBytes refuses
	check("max bytes")

	// Mixed sizes while a worker acks concurrently.
	done := make(chan struct{})
	consumed := make(chan map[string]int)
	go func() {
		got := map[string]int{}
		c, err := b.q.Consumer(b.ctx, "wq")
		if err != nil {
			t.Error(err)
		}
		for {
			select {
			case <-done:
				consumed <- got
				return
			default:
			}
			msgs, err := c.Fetch(b.ctx, 4, 20*time.Millisecond)
			if err != nil {
				t.Error(err)
			}
			for _, m := range msgs {
				got[m.Job.ID]++
				if err := m.Ack(b.ctx); err != nil {
					t.Error(err)
				}
			}
		}
	}()
	run(400, func(r *rand.Rand) int { return r.IntN(3000) })
	close(done)
	for id, n := range <-consumed {
		seen[id] += n
	}
	check("mixed, concurrent acks")

	if refusals["msgs"] == 0 || refusals["bytes"] == 0 {
		t.Fatalf("refusals %v: both limits should have refused", refusals)
	}
	for id := range accepted {
		if seen[id] != 1 {
			t.Fatalf("accepted job %s delivered %d times", id, seen[id])
		}
	}
	if len(seen) != len(accepted) {
		t.Fatalf("%d jobs delivered, %d accepted", len(seen), len(accepted))
	}
	t.Logf("accepted %d, refused %v", len(accepted), refusals)
}

// A publish that fails because the server is down returns an error, and the job is never left
// stored: this test's connection buffers a publish made while it reconnects and sends it once
// the server is back (the processes' connections do not: connect.NATS), so the job may land
// after Publish gave up. Publish then withdraws it: its message is deleted and its status is
// canceled, so no worker delivers it.
func TestPublishFailureWithdrawn(t *testing.T) {
	p := testenv.NATSProc(t)
	b := setupURL(t, p.URL, queue.Options{}, queue.Spec{Name: "orders"})
	p.Kill()
	job := &queue.Job{Queue: "orders", Body: []byte("x"), ID: queue.NewJobID("orders")}
	ctx, cancel := context.WithTimeout(b.ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := b.q.Publish(ctx, job); err == nil {
		t.Fatal("publish with the server down succeeded")
	}
	p.Start()
	testenv.WaitFor(t, 10*time.Second, "reconnect", func() bool { return b.nc.Status() == nats.CONNECTED })
	// A round trip on the connection: anything it buffered while down has reached the server.
	if err := b.nc.FlushWithContext(b.ctx); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the failed publish to be withdrawn", func() bool {
		return !b.stored("orders", job.ID)
	})
	st, err := b.q.Status(b.ctx, job.ID)
	if !errors.Is(err, queue.ErrNotFound) && (err != nil || st.State != queue.StateCanceled) {
		t.Fatalf("status of the failed publish %+v, %v; want ErrNotFound or canceled", st, err)
	}
	t.Logf("status after the failed publish: %q, %v", st.State, err)
}

// The "no 202'd job lost" guarantee: publishers run while the server is killed (SIGKILL) and
// restarted; every Publish that returned nil is in the stream afterwards.
func TestCrashNoAcceptedJobLost(t *testing.T) {
	p := testenv.NATSProc(t)
	b := setupURL(t, p.URL, queue.Options{}, queue.Spec{Name: "orders"})
	const total, workers = 2000, 16
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		accepted = make(map[string]bool, total)
		failed   int
		next     = make(chan int, total)
	)
	for i := range total {
		next <- i
	}
	close(next)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				job := &queue.Job{Queue: "orders", Body: fmt.Appendf(nil, "job %d", i)}
				if i%4 == 0 {
					job.IdempotencyKey = fmt.Sprint("key-", i)
				}
				// A request in flight when the server dies gets no answer: bound each call.
				ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
				_, err := b.q.Publish(ctx, job)
				cancel()
				mu.Lock()
				if err == nil {
					accepted[job.ID] = true
				} else {
					failed++
				}
				mu.Unlock()
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(accepted) }
	testenv.WaitFor(t, 60*time.Second, "a quarter of the jobs accepted", func() bool { return count() >= total/4 })
	p.Kill()
	killedAt := count()
	p.Start()
	wg.Wait()
	if killedAt >= total || count() <= killedAt {
		t.Fatalf("accepted %d before the kill and %d in all: the crash was not mid-run", killedAt, count())
	}
	testenv.WaitFor(t, 10*time.Second, "reconnect", func() bool { return b.nc.Status() == nats.CONNECTED })
	seen := b.drain("orders")
	for id := range accepted {
		if seen[id] == 0 {
			t.Errorf("job %s was accepted and is not in the stream", id)
		}
	}
	t.Logf("accepted %d (%d before the kill), failed %d, in stream %d", len(accepted), killedAt, failed, len(seen))
}
