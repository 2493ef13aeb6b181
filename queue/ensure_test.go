package queue_test

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// Provisioning what already exists as wanted sends JetStream no update: every process
// provisions at start and on each reload, and the server's updates of a store raced its
// consumer creations from other processes. A changed setting is still applied.
func TestProvisionAgainSendsNoUpdates(t *testing.T) {
	specs := []queue.Spec{{Name: "plain", MaxBytes: 1 << 20}, {Name: "fair", Fair: true}}
	b := setup(t, queue.Options{}, specs...)
	watch := testenv.Connect(t, b.url)
	var updates atomic.Int64
	for _, subj := range []string{"$JS.API.STREAM.UPDATE.>", "$JS.API.CONSUMER.CREATE.>", "$JS.API.CONSUMER.DURABLE.CREATE.>"} {
		if _, err := watch.Subscribe(subj, func(m *nats.Msg) { updates.Add(1); t.Logf("update %s", m.Subject) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := b.q.Provision(b.ctx, specs); err != nil {
		t.Fatal(err)
	}
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := updates.Load(); n != 0 {
		t.Errorf("provisioning unchanged queues again sent %d updates, want 0", n)
	}

	specs[0].MaxDepth = 7
	if err := b.q.Provision(b.ctx, specs); err != nil {
		t.Fatal(err)
	}
	info, err := b.js.Stream(b.ctx, b.stream("plain"))
	if err != nil {
		t.Fatal(err)
	}
	if got := info.CachedInfo().Config.MaxMsgs; got != 7 {
		t.Errorf("MaxMsgs after a changed max depth = %d, want 7", got)
	}
}

// apiWatch counts the JetStream API requests sent on url by their kind and object
// (STREAM.CREATE.<stream>, CONSUMER.INFO.<stream>.<consumer>, ...).
type apiWatch struct {
	mu   sync.Mutex
	seen map[string]int
	nc   *nats.Conn
}

func watchAPI(t *testing.T, url string) *apiWatch {
	w := &apiWatch{seen: map[string]int{}, nc: testenv.Connect(t, url)}
	if _, err := w.nc.Subscribe("$JS.API.>", func(m *nats.Msg) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.seen[strings.TrimPrefix(m.Subject, "$JS.API.")]++
	}); err != nil {
		t.Fatal(err)
	}
	if err := w.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return w
}

// take returns how many requests seen so far have a subject that starts with kind and
// contains part, once the sender's requests have reached the server.
func (w *apiWatch) take(t *testing.T, sender *nats.Conn, kind, part string) int {
	t.Helper()
	if err := sender.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := w.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for subj, c := range w.seen {
		if strings.HasPrefix(subj, kind) && strings.Contains(subj, part) {
			n += c
		}
	}
	return n
}

// On a fresh server Provision looks up nothing that its one listing found missing: per queue
// one stream creation and one consumer creation (nats-server answers lookups only when no
// creation waits, so processes starting together stalled on them). The admission ledger is
// made by the queue's first job, which max_depth then bounds as before; provisioning again
// creates nothing.
func TestProvisionFreshLooksNothingUp(t *testing.T) {
	b := setup(t, queue.Options{})
	specs := []queue.Spec{{Name: "a", MaxDepth: 2}, {Name: "b"}, {Name: "c"}}
	w := watchAPI(t, b.url)
	if err := b.q.Provision(b.ctx, specs); err != nil {
		t.Fatal(err)
	}
	q := b.prefix + "_Q_"
	if n := w.take(t, b.nc, "STREAM.INFO."+q, ""); n != 0 {
		t.Errorf("fresh provision looked up %d queue streams, want 0", n)
	}
	if n := w.take(t, b.nc, "CONSUMER.INFO."+q, ""); n != 0 {
		t.Errorf("fresh provision looked up %d consumers, want 0", n)
	}
	if n := w.take(t, b.nc, "STREAM.CREATE."+q, ""); n != 3 {
		t.Errorf("fresh provision sent %d queue stream creations, want 3", n)
	}
	if n := w.take(t, b.nc, "CONSUMER.CREATE."+q, ""); n != 3 {
		t.Errorf("fresh provision sent %d consumer creations, want 3", n)
	}
	if n := w.take(t, b.nc, "STREAM.NAMES", ""); n != 1 {
		t.Errorf("fresh provision sent %d stream listings, want 1", n)
	}
	if n := w.take(t, b.nc, "", b.prefix+"_L_"); n != 0 {
		t.Errorf("fresh provision sent %d requests about ledgers, want 0 (made on demand)", n)
	}
	b.noStream("_L_a")

	b.publish(&queue.Job{Queue: "a", Direct: true})
	b.publish(&queue.Job{Queue: "a", Direct: true})
	_, err := b.q.Publish(b.ctx, &queue.Job{Queue: "a", Direct: true})
	wantErr(t, err, queue.ErrFull)
	if _, err := b.js.Stream(b.ctx, b.prefix+"_L_a"); err != nil {
		t.Fatalf("ledger after the first jobs: %v", err)
	}
	b.noStream("_L_b")

	w.take(t, b.nc, "", "")
	w.mu.Lock()
	clear(w.seen)
	w.mu.Unlock()
	if err := b.q.Provision(b.ctx, specs); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"STREAM.CREATE", "STREAM.UPDATE", "CONSUMER.CREATE"} {
		if n := w.take(t, b.nc, kind, ""); n != 0 {
			t.Errorf("provisioning again sent %d %s, want 0", n, kind)
		}
	}
}

// A burst of first jobs on a queue whose ledger is not made yet makes it (several makes may
// run at once, each idempotent) and max_depth holds exactly: 5 accepted of 16, the rest full.
func TestLedgerMadeByConcurrentFirstJobs(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q", MaxDepth: 5})
	b.noStream("_L_q")
	var wg sync.WaitGroup
	var accepted, full atomic.Int64
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			_, err := b.q.Publish(b.ctx, &queue.Job{Queue: "q", Direct: true})
			switch {
			case err == nil:
				accepted.Add(1)
			case errors.Is(err, queue.ErrFull):
				full.Add(1)
			default:
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("publish: %v", err)
	}
	if accepted.Load() != 5 || full.Load() != 11 {
		t.Fatalf("accepted %d, full %d; want 5 and 11", accepted.Load(), full.Load())
	}
}
