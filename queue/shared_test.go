package queue_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/queue"
)

// TestSharedStreamReaders: a queue of a shared stream is read as one of its own is — its
// job's status, place, browse, depth (Info and Counts), cancel, dead letter and replay, a
// delayed job, an Idempotency-Key repeat — while the queues that cannot be shared (fair, with
// priorities, with max_bytes) keep their own stream beside it.
func TestSharedStreamReaders(t *testing.T) {
	b := setup(t, queue.Options{SharedStreams: 3},
		queue.Spec{Name: "s"}, queue.Spec{Name: "f", Fair: true}, queue.Spec{Name: "p", Priorities: true},
		queue.Spec{Name: "m", MaxBytes: 1 << 20})
	for _, name := range []string{"f", "p", "m"} {
		if b.q.Shared(name) {
			t.Errorf("queue %q is shared; it needs a stream of its own", name)
		}
		if _, err := b.js.Stream(b.ctx, b.stream(name)); err != nil {
			t.Errorf("stream of %q: %v", name, err)
		}
	}
	if !b.q.Shared("s") {
		t.Fatal(`queue "s" is not shared`)
	}
	b.noStream("_Q_s")

	job := func() *queue.Job {
		return &queue.Job{Queue: "s", Method: http.MethodPost, Path: "/x", Body: []byte("hello")}
	}
	r1 := b.publish(job())
	r2 := b.publish(job())
	k := job()
	k.IdempotencyKey = "key-1"
	r3 := b.publish(k)
	if again := b.publish(func() *queue.Job { j := job(); j.IdempotencyKey = "key-1"; return j }()); !again.Replayed || again.ID != r3.ID {
		t.Fatalf("a repeat of an Idempotency-Key: %+v, want a replay of %s", again, r3.ID)
	}
	st, err := b.q.Status(b.ctx, r1.ID)
	if err != nil || st.State != queue.StateQueued || st.Queue != "s" {
		t.Fatalf("status: %+v, %v", st, err)
	}
	if pl, err := b.q.Place(b.ctx, st); err != nil || pl.Seq == 0 {
		t.Fatalf("place: %+v, %v", pl, err)
	}
	page, err := b.q.Browse(b.ctx, "s", queue.BrowseQuery{Source: queue.SourceWaiting})
	if err != nil || len(page.Jobs) != 3 {
		t.Fatalf("browse: %d jobs, %v; want 3", len(page.Jobs), err)
	}
	if in, err := b.q.Info(b.ctx, "s"); err != nil || in.Depth != 3 {
		t.Fatalf("info before any consumer: %+v, %v", in, err)
	}
	if bl, err := b.q.Backlog(b.ctx, "s"); err != nil || bl.Pending != 3 || bl.AckFloor != 0 {
		t.Fatalf("backlog before any consumer: %+v, %v; want 3 pending, the stream's 3 jobs ahead of the last", bl, err)
	}
	if l, err := b.q.Ledgers(b.ctx); err != nil || l["s"] != 3 || len(l) != 1 {
		t.Fatalf("ledgers: %v, %v; want s's alone, with 3 tickets", l, err)
	}
	if _, err := b.q.Cancel(b.ctx, r2.ID); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	counts, err := b.q.Counts(b.ctx, false)
	if err != nil || counts["s"].Depth != 2 {
		t.Fatalf("counts after a cancel: %+v, %v; want s at 2", counts["s"], err)
	}

	// The consumer, made by its first user; the first job dead-lettered, then replayed.
	c := b.consumer("s")
	m := b.fetchOne(c, time.Second)
	if err := b.q.DeadLetter(b.ctx, m, "test", 500, 1); err != nil {
		t.Fatalf("dead letter: %v", err)
	}
	if in, err := b.q.Info(b.ctx, "s"); err != nil || in.Depth != 1 || in.DeadLetters != 1 || in.Consumers != 1 {
		t.Fatalf("info after a dead letter: %+v, %v; want depth 1, 1 dead letter", in, err)
	}
	if err := b.q.Replay(b.ctx, "s", m.Job.ID); err != nil {
		t.Fatalf("replay: %v", err)
	}
	seen := map[string]bool{}
	for len(seen) < 2 {
		got := b.fetchOne(c, 2*time.Second)
		seen[got.Job.ID] = true
		if err := got.Ack(b.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !seen[m.Job.ID] {
		t.Fatalf("the replayed job %s was not delivered: %v", m.Job.ID, seen)
	}
	if in, err := b.q.Info(b.ctx, "s"); err != nil || in.Depth != 0 || in.Left == 0 {
		t.Fatalf("info after the drain: %+v, %v", in, err)
	}
	waiting, err := b.q.Waiting(b.ctx)
	if err != nil || len(waiting) != 0 {
		t.Fatalf("waiting after the drain: %v, %v", waiting, err)
	}
	// A delayed job waits in the queue's schedule stream, not the shared one.
	d := job()
	d.NotBefore = time.Now().Add(time.Hour)
	dr := b.publish(d)
	if st, err := b.q.Status(b.ctx, dr.ID); err != nil || st.State != queue.StateScheduled {
		t.Fatalf("status of a delayed job: %+v, %v", st, err)
	}
	slot := sharedSlot(t, b, "s")
	if err := b.q.ResetConsumers(b.ctx, []string{"s"}); err != nil {
		t.Fatalf("reset: %v", err)
	}
	if _, err := b.js.Consumer(b.ctx, b.prefix+"_J_"+slot, "s"); slot == "none" || !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("consumer after a reset: %v", err)
	}
}

// sharedSlot finds which shared stream holds queue name's consumer: "none" if none does.
func sharedSlot(t *testing.T, b *bundle, name string) string {
	t.Helper()
	for _, k := range []string{"0", "1", "2"} {
		if _, err := b.js.Consumer(b.ctx, b.prefix+"_J_"+k, name); err == nil {
			return k
		}
	}
	return "none"
}

// TestSharedCountMismatch: a process whose shared_streams differs from the one that made the
// shared streams is refused at Provision, naming both, instead of looking for jobs elsewhere.
func TestSharedCountMismatch(t *testing.T) {
	b := setup(t, queue.Options{SharedStreams: 4}, queue.Spec{Name: "s"})
	other, err := queue.New(b.ctx, b.js, queue.Options{Prefix: b.prefix, SharedStreams: 8})
	if err != nil {
		t.Fatal(err)
	}
	err = other.Provision(b.ctx, []queue.Spec{{Name: "s"}})
	if !errors.Is(err, queue.ErrSharedCount) || !strings.Contains(err.Error(), "shared_streams 8") || !strings.Contains(err.Error(), "of 4") {
		t.Fatalf("provision with 8 shared streams over 4: %v", err)
	}
	if err := other.Provision(b.ctx, []queue.Spec{{Name: "own", MaxBytes: 1 << 20}}); err != nil {
		t.Fatalf("provision without a shared queue: %v", err)
	}
}
