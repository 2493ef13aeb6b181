package queue_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/queue"
)

// statusEntries is the number of messages in the status bucket's stream.
func (b *bundle) statusEntries() uint64 {
	b.t.Helper()
	st, err := b.js.Stream(b.ctx, "KV_"+b.prefix+"_STATUS")
	if err != nil {
		b.t.Fatal(err)
	}
	info, err := st.Info(b.ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	return info.State.Msgs
}

// A job without an Idempotency-Key is one stored message: Status reads the job itself while it
// waits. A keyed job also writes its idempotency record.
func TestUnkeyedPublishStoresOneMessage(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "orders"})
	created := time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC)
	var ids []string
	for range 5 {
		ids = append(ids, b.publish(&queue.Job{Queue: "orders", Body: []byte("x"), CreatedAt: created}).ID)
	}
	if n := b.statusEntries(); n != 0 {
		t.Fatalf("%d status entries after unkeyed publishes, want 0", n)
	}
	for _, id := range ids {
		st, err := b.q.Status(b.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if st.ID != id || st.State != queue.StateQueued || st.Queue != "orders" || !st.CreatedAt.Equal(created) ||
			st.UpdatedAt.Before(created) || st.Attempts != 0 {
			t.Fatalf("status of a waiting job: %+v", st)
		}
	}
	b.publish(&queue.Job{Queue: "orders", IdempotencyKey: "k"})
	if n := b.statusEntries(); n != 1 {
		t.Fatalf("%d status entries after a keyed publish, want 1", n)
	}
	// An id of the caller's that does not carry the queue's tag is recorded too, so it is found.
	own := b.publish(&queue.Job{Queue: "orders", ID: "caller-chosen-id"})
	if st, err := b.q.Status(b.ctx, own.ID); err != nil || st.State != queue.StateQueued {
		t.Fatalf("status of a job with the caller's id: %+v, %v", st, err)
	}
	if n := b.statusEntries(); n != 2 {
		t.Fatalf("%d status entries, want 2", n)
	}
	if d := b.depth("orders"); d != 7 {
		t.Fatalf("depth %d, want 7", d)
	}
}

// The status of an unkeyed job follows its worker: queued from the stream, then whatever the
// worker records. SetStatus without CreatedAt or Queue takes them from the waiting job.
func TestStatusFollowsWorker(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q"})
	created := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	r := b.publish(&queue.Job{Queue: "q", CreatedAt: created})
	m := b.fetchOne(b.consumer("q"), 5*time.Second)
	if st, err := b.q.Status(b.ctx, r.ID); err != nil || st.State != queue.StateQueued {
		t.Fatalf("held by a worker that recorded nothing yet: %+v, %v; want queued", st, err)
	}
	if err := b.q.SetStatus(b.ctx, queue.Status{ID: r.ID, State: queue.StateRunning, Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	st, err := b.q.Status(b.ctx, r.ID)
	if err != nil || st.State != queue.StateRunning || st.Queue != "q" || !st.CreatedAt.Equal(created) {
		t.Fatalf("running: %+v, %v", st, err)
	}
	if err := b.q.SetStatus(b.ctx, queue.Status{ID: r.ID, State: queue.StateSucceeded, Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	if err := m.Ack(b.ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := b.q.Status(b.ctx, r.ID); err != nil || st.State != queue.StateSucceeded {
		t.Fatalf("after the ack: %+v, %v", st, err)
	}

	// A job that left the queue with nothing recorded is unknown, not "queued".
	gone := b.publish(&queue.Job{Queue: "q"})
	m = b.fetchOne(b.consumer("q"), 5*time.Second)
	if err := m.Ack(b.ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := b.q.Status(b.ctx, gone.ID); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("acked with no status recorded: %+v, %v; want ErrNotFound", st, err)
	}
}

// Status reads the entry, the stream, and the entry again: a job that a worker takes, records
// and acks while Status runs is never reported unknown. Workers record before they ack.
func TestStatusNeverLosesAJobInTransit(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q"})
	const n = 300
	c := b.consumer("q")
	stop, finished := make(chan struct{}), make(chan int)
	go func() { // the worker: record, then ack, as fast as it can
		count := 0
		defer func() { finished <- count }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			msgs, err := c.Fetch(b.ctx, 1, 100*time.Millisecond)
			if err != nil {
				t.Error(err)
				return
			}
			for _, m := range msgs {
				if err := b.q.SetStatus(b.ctx, queue.Status{ID: m.Job.ID, Queue: "q", State: queue.StateSucceeded,
					Attempts: 1, CreatedAt: m.Job.CreatedAt}); err != nil {
					t.Error(err)
				}
				if err := m.Ack(b.ctx); err != nil {
					t.Error(err)
				}
				count++
			}
		}
	}()
	var (
		wg     sync.WaitGroup
		states sync.Map
	)
	for range 4 {
		wg.Add(1)
		go func() { // clients: publish, then poll until the job is final
			defer wg.Done()
			for range n / 4 {
				r, err := b.q.Publish(b.ctx, &queue.Job{Queue: "q"})
				if err != nil {
					t.Error(err)
					return
				}
				for {
					st, err := b.q.Status(b.ctx, r.ID)
					if err != nil {
						t.Errorf("status of %s in transit: %v", r.ID, err)
						return
					}
					states.Store(st.State, true)
					if st.State == queue.StateSucceeded {
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	if got := <-finished; got != n {
		t.Fatalf("the worker finished %d jobs, want %d", got, n)
	}
	var seen []string
	states.Range(func(k, _ any) bool { seen = append(seen, string(k.(queue.State))); return true })
	slices.Sort(seen)
	t.Logf("states seen: %v", seen)
}

// Two provisioned queues whose names share a tag: Status looks in both.
func TestStatusQueueTagCollision(t *testing.T) {
	names := map[string]string{} // JobID tag → queue name
	var a, c string
	for i := 0; a == ""; i++ {
		name := fmt.Sprint("q", i)
		id := queue.NewJobID(name)
		tag := id[len(id)-4:]
		if other, ok := names[tag]; ok {
			a, c = other, name
		}
		names[tag] = name
	}
	b := setup(t, queue.Options{}, queue.Spec{Name: a}, queue.Spec{Name: c})
	for _, name := range []string{a, c} {
		r := b.publish(&queue.Job{Queue: name})
		if st, err := b.q.Status(b.ctx, r.ID); err != nil || st.Queue != name || st.State != queue.StateQueued {
			t.Fatalf("job of %q: %+v, %v", name, st, err)
		}
	}
	// The tag of a queue this Queues does not know leads nowhere.
	if _, err := b.q.Status(b.ctx, queue.NewJobID("elsewhere")); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
}

// A queue's stream made by an earlier version (one subject for every job) is updated in place:
// its waiting jobs are delivered, and new jobs go to subjects of their own.
func TestProvisionUpgradesQueueStream(t *testing.T) {
	b := setup(t, queue.Options{})
	if _, err := b.js.CreateStream(b.ctx, jetstream.StreamConfig{Name: b.stream("orders"),
		Subjects: []string{b.subject("orders")}, Retention: jetstream.WorkQueuePolicy,
		Discard: jetstream.DiscardNew, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg(b.subject("orders"))
	msg.Header.Set("Sluice-Job", `{"id":"old-job","queue":"orders","created_at":"2025-01-01T00:00:00Z"}`)
	msg.Data = []byte("before")
	if _, err := b.js.PublishMsg(b.ctx, msg, jetstream.WithMsgID("old-job")); err != nil {
		t.Fatal(err)
	}
	if err := b.q.Provision(b.ctx, []queue.Spec{{Name: "orders"}}); err != nil {
		t.Fatal(err)
	}
	r := b.publish(&queue.Job{Queue: "orders", Body: []byte("after")})
	if !b.stored("orders", r.ID) {
		t.Fatal("the new job is not on a subject of its own")
	}
	seen := b.drain("orders")
	if seen["old-job"] != 1 || seen[r.ID] != 1 || len(seen) != 2 {
		t.Fatalf("delivered %v", seen)
	}
}

// Of deliveries that claim one attempt of a job at once, exactly one succeeds; a later attempt
// can be claimed, and a final record cannot be claimed over.
func TestClaimAttemptOnce(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q"})
	r := b.publish(&queue.Job{Queue: "q"})
	const claimers = 8
	errs := make(chan error, claimers)
	for range claimers {
		go func() {
			errs <- b.q.ClaimAttempt(b.ctx, queue.Status{ID: r.ID, Queue: "q", State: queue.StateRunning, Attempts: 1, Delivered: 1})
		}()
	}
	won := 0
	for range claimers {
		switch err := <-errs; {
		case err == nil:
			won++
		case !errors.Is(err, queue.ErrClaimed):
			t.Fatalf("claim: %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d of %d concurrent claims of attempt 1 won, want 1", won, claimers)
	}
	if err := b.q.ClaimAttempt(b.ctx, queue.Status{ID: r.ID, State: queue.StateRunning, Attempts: 2}); err != nil {
		t.Fatalf("claim of attempt 2: %v", err)
	}
	if st, err := b.q.Status(b.ctx, r.ID); err != nil || st.Attempts != 2 || st.State != queue.StateRunning {
		t.Fatalf("after claiming attempt 2: %+v, %v", st, err)
	}
	if err := b.q.SetStatus(b.ctx, queue.Status{ID: r.ID, State: queue.StateSucceeded, Attempts: 2}); err != nil {
		t.Fatal(err)
	}
	if err := b.q.ClaimAttempt(b.ctx, queue.Status{ID: r.ID, State: queue.StateRunning, Attempts: 3}); !errors.Is(err, queue.ErrClaimed) {
		t.Fatalf("claim over a final record: %v, want ErrClaimed", err)
	}
}
