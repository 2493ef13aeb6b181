package queue_test

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice/queue"
)

// TestRemoveLeftoversFinal: of four jobs delivered and not acked (their AckWait an hour), the
// one whose worker recorded it succeeded and then died is removed, with its ticket; the one
// running, the one without a record and the one whose failed record predates its message (a
// replayed dead letter) stay. Nothing is removed while the final record is younger than a live
// worker needs to ack, and a page of two goes on where it stopped.
func TestRemoveLeftoversFinal(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q", AckWait: time.Hour})
	before := time.Now().Add(-time.Minute)
	ids := make([]string, 4)
	for i := range ids {
		ids[i] = b.publish(&queue.Job{Queue: "q", Body: []byte("job")}).ID
	}
	c := b.consumer("q")
	msgs, err := c.Fetch(b.ctx, 4, time.Second)
	if err != nil || len(msgs) != 4 {
		t.Fatalf("fetch: %d jobs, %v", len(msgs), err)
	}
	for id, st := range map[string]queue.Status{
		ids[0]: {State: queue.StateSucceeded, Attempts: 1},
		ids[1]: {State: queue.StateRunning, Attempts: 1},
		ids[3]: {State: queue.StateFailed, Attempts: 5, UpdatedAt: before},
	} {
		st.ID, st.Queue = id, "q"
		if err := b.q.SetStatus(b.ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	ledger := func() uint64 {
		st, err := b.js.Stream(b.ctx, b.prefix+"_A_q")
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}

	if n, next, err := b.q.RemoveLeftovers(b.ctx, "q", 0, 10); err != nil || n != 0 || next != 0 {
		t.Fatalf("with the final record fresh: removed %d, next %d, %v; want none, 0", n, next, err)
	}
	queue.SetClock(b.q, func() time.Time { return time.Now().Add(10 * time.Second) })
	n, next, err := b.q.RemoveLeftovers(b.ctx, "q", 0, 2)
	if err != nil || n != 1 || next == 0 {
		t.Fatalf("first page of 2: removed %d, next %d, %v; want 1, a sequence to go on from", n, next, err)
	}
	if n, next, err := b.q.RemoveLeftovers(b.ctx, "q", next, 2); err != nil || n != 0 || next != 0 {
		t.Fatalf("second page: removed %d, next %d, %v; want 0, 0 (all looked at)", n, next, err)
	}
	if b.stored("q", ids[0]) {
		t.Error("the succeeded job is still in the stream")
	}
	for _, id := range ids[1:] {
		if !b.stored("q", id) {
			t.Errorf("job %s was removed; only the succeeded one should be", id)
		}
	}
	if got := ledger(); got != 3 {
		t.Errorf("the ledger holds %d tickets; want 3 (the removed job's released)", got)
	}
	info, err := b.q.Info(b.ctx, "q")
	if err != nil || info.Depth != 3 {
		t.Fatalf("depth %d (%v); want 3", info.Depth, err)
	}
	// The worker that held it comes back and acks: no error, nothing else changes.
	if err := msgs[0].Ack(b.ctx); err != nil {
		t.Errorf("ack of the removed job: %v", err)
	}
	if d := b.depth("q"); d != 3 {
		t.Errorf("depth %d after the late ack; want 3", d)
	}
}
