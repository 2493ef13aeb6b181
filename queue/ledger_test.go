package queue_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/queue"
)

// heldJobs is what queue name holds: its streams' jobs, scheduled ones included.
func (b *bundle) heldJobs(name string) uint64 {
	b.t.Helper()
	info, err := b.q.Info(b.ctx, name)
	if err != nil {
		b.t.Fatal(err)
	}
	return info.Depth + info.Scheduled
}

// Every door counts against one bound, exactly: 64 publishers at once, half of them through
// a second connection (another process, as far as the server can tell), through the plain
// path, keyed jobs, priorities and schedules, into a queue of max_depth 200 leave it holding
// exactly 200 (none over, none refused while there was room); an ack gives one place back.
func TestLedgerHoldsMaxDepthAcrossDoors(t *testing.T) {
	spec := queue.Spec{Name: "q", MaxDepth: 200, Priorities: true}
	b := setup(t, queue.Options{}, spec)
	other := setupURL(t, b.url, b.opts, spec)
	var accepted, full atomic.Int64
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 8 {
				j := &queue.Job{Queue: "q", Direct: true, Body: []byte("x")}
				switch (w + i) % 4 {
				case 1:
					j.IdempotencyKey = fmt.Sprintf("k-%d-%d", w, i)
				case 2:
					j.Priority = queue.PriorityHigh
				case 3:
					j.NotBefore = time.Now().Add(time.Hour)
				}
				q := b.q
				if w%2 == 1 {
					q = other.q
				}
				_, err := q.Publish(b.ctx, j)
				switch {
				case err == nil:
					accepted.Add(1)
				case errors.Is(err, queue.ErrFull):
					full.Add(1)
				default:
					t.Errorf("publish: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	held := b.heldJobs("q")
	t.Logf("512 publishes: %d accepted, %d refused full; the queue holds %d", accepted.Load(), full.Load(), held)
	if accepted.Load() != 200 || held != 200 {
		t.Fatalf("accepted %d, held %d; want exactly max_depth 200", accepted.Load(), held)
	}
	m := b.fetchOne(b.consumer("q"), 5*time.Second)
	if err := m.Ack(b.ctx); err != nil {
		t.Fatal(err)
	}
	// The ack's release runs in the background: the place comes back once it landed.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := b.q.Publish(b.ctx, &queue.Job{Queue: "q", Direct: true})
		if err == nil {
			break
		}
		if !errors.Is(err, queue.ErrFull) || time.Now().After(deadline) {
			t.Fatalf("publish after an ack: %v, want the acked job's place back", err)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition with a deadline
	}
}

// tenant_max_depth counts a tenant's scheduled jobs with its waiting ones; a canceled
// scheduled job gives its place back; other tenants are not refused.
func TestLedgerTenantCountsScheduled(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q", MaxDepth: 100, TenantMaxDepth: 10})
	var ids []string
	for i := range 10 {
		j := &queue.Job{Queue: "q", Direct: true, Tenant: "a"}
		if i%2 == 0 {
			j.NotBefore = time.Now().Add(time.Hour)
		}
		ids = append(ids, b.publish(j).ID)
	}
	for _, late := range []bool{false, true} {
		j := &queue.Job{Queue: "q", Direct: true, Tenant: "a"}
		if late {
			j.NotBefore = time.Now().Add(time.Hour)
		}
		_, err := b.q.Publish(b.ctx, j)
		wantErr(t, err, queue.ErrTenantFull)
	}
	b.publish(&queue.Job{Queue: "q", Direct: true, Tenant: "b", NotBefore: time.Now().Add(time.Hour)})
	if _, err := b.q.Cancel(b.ctx, ids[0]); err != nil { // a scheduled one
		t.Fatal(err)
	}
	b.publish(&queue.Job{Queue: "q", Direct: true, Tenant: "a"})
}

// A deferral budget holds one key to PerKey waiting jobs; another key is not refused.
func TestLedgerBudgetPerKey(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q", MaxDepth: 100})
	budget := func(key string) *queue.Budget { return &queue.Budget{Name: "orders-per-key", Key: key, PerKey: 3} }
	for range 3 {
		b.publish(&queue.Job{Queue: "q", Method: "POST", Path: "/api/orders", Budget: budget("flood")})
	}
	_, err := b.q.Publish(b.ctx, &queue.Job{Queue: "q", Method: "POST", Path: "/api/orders", Budget: budget("flood")})
	wantErr(t, err, queue.ErrBudgetFull)
	b.publish(&queue.Job{Queue: "q", Method: "POST", Path: "/api/orders", Budget: budget("other")})
	if held := b.heldJobs("q"); held != 4 {
		t.Fatalf("the queue holds %d, want 4 (the refused job takes no place)", held)
	}
	// The flooding key's jobs all leave behind the queue layer's back (a worker that died
	// after each ack): the sweep gives the key its budget back.
	c, err := b.js.Consumer(b.ctx, b.stream("q"), "workers")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(4, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		_ = m.DoubleAck(b.ctx)
	}
	n, err := b.q.SweepBudgets(b.ctx, 0, 100)
	if err != nil || n != 4 {
		t.Fatalf("sweep of the budgets: %d, %v; want the 4 tickets of jobs gone", n, err)
	}
	b.publish(&queue.Job{Queue: "q", Method: "POST", Path: "/api/orders", Budget: budget("flood")})
}

// The schedule stream's bytes are bounded by max_bytes: 1 MB scheduled jobs into 4 MiB stop
// at the fourth.
func TestLedgerScheduledBytes(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q", MaxBytes: 4 << 20, MaxBodyBytes: 2 << 20})
	body := make([]byte, 1_000_000)
	accepted := 0
	for range 8 {
		_, err := b.q.Publish(b.ctx, &queue.Job{Queue: "q", Direct: true, Body: body, NotBefore: time.Now().Add(time.Hour)})
		if errors.Is(err, queue.ErrFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		accepted++
	}
	if accepted != 4 {
		t.Fatalf("%d scheduled jobs of 1 MB accepted under max_bytes 4 MiB, want 4", accepted)
	}
}

// A ticket whose job left without releasing it (its worker died between the ack and the
// release) is swept; the ticket of a job still waiting is not.
func TestSweepLedger(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q", MaxDepth: 2})
	b.publish(&queue.Job{Queue: "q", Direct: true})
	b.publish(&queue.Job{Queue: "q", Direct: true})
	// The first job acked behind the queue layer's back: its ticket stays.
	c, err := b.js.Consumer(b.ctx, b.stream("q"), "workers")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.DoubleAck(b.ctx); err != nil {
			t.Fatal(err)
		}
	}
	_, err = b.q.Publish(b.ctx, &queue.Job{Queue: "q", Direct: true})
	wantErr(t, err, queue.ErrFull)
	removed, next, err := b.q.SweepLedger(b.ctx, "q", 0, 0, 100)
	if err != nil || removed != 1 || next != 0 {
		t.Fatalf("sweep: removed %d, next %d, %v; want the leaked ticket only", removed, next, err)
	}
	b.publish(&queue.Job{Queue: "q", Direct: true})
	if removed, _, err := b.q.SweepLedger(b.ctx, "q", 0, 0, 100); err != nil || removed != 0 {
		t.Fatalf("second sweep: removed %d, %v; want none (both jobs wait)", removed, err)
	}
}

// A ledger deleted behind the queue's back is made again by the next publish, which succeeds.
func TestLedgerMadeAgain(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q", MaxDepth: 5})
	b.publish(&queue.Job{Queue: "q", Direct: true}) // makes the ledger
	if err := b.js.DeleteStream(b.ctx, b.prefix+"_L_q"); err != nil {
		t.Fatal(err)
	}
	b.publish(&queue.Job{Queue: "q", Direct: true})
	if _, err := b.js.Stream(b.ctx, b.prefix+"_L_q"); err != nil {
		t.Fatalf("ledger after a publish: %v, want it made again", err)
	}
}

// The queue's ticket and the budget's are taken together: when one refuses, the other is given
// back before Publish returns, so a refused job holds no place in either ledger.
func TestLedgerRefusalReleasesTheOtherTicket(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q", MaxDepth: 2})
	msgs := func(part string) uint64 { // messages of the one ledger stream whose name has part
		t.Helper()
		var n uint64
		found := 0
		for st := range b.js.ListStreams(b.ctx).Info() {
			if strings.Contains(st.Config.Name, part) {
				n, found = st.State.Msgs, found+1
			}
		}
		if found != 1 {
			t.Fatalf("%d streams named *%s*, want 1", found, part)
		}
		return n
	}
	job := func(key string, perKey int64) *queue.Job {
		return &queue.Job{Queue: "q", Method: "POST", Path: "/api/orders",
			Budget: &queue.Budget{Name: "orders", Key: key, PerKey: perKey}}
	}
	// The budget refuses (one per key): the queue's ticket is given back.
	b.publish(job("a", 1))
	for range 3 {
		_, err := b.q.Publish(b.ctx, job("a", 1))
		wantErr(t, err, queue.ErrBudgetFull)
	}
	if n := msgs("_L_q"); n != 1 {
		t.Fatalf("the queue's ledger holds %d tickets after 3 budget refusals, want 1", n)
	}
	// The queue refuses (max_depth 2): the budget's ticket is given back.
	b.publish(job("b", 10))
	for range 5 {
		_, err := b.q.Publish(b.ctx, job("b", 10))
		wantErr(t, err, queue.ErrFull)
	}
	if n := msgs("_KW_"); n != 2 {
		t.Fatalf("the budget's ledger holds %d tickets after 5 refusals of a full queue, want 2 (a's and b's)", n)
	}
	if held := b.heldJobs("q"); held != 2 {
		t.Fatalf("the queue holds %d jobs, want 2", held)
	}
}
