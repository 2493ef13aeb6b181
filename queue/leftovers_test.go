package queue_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/sluice-rl/sluice/internal/testenv"
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
		st, err := b.js.Stream(b.ctx, b.prefix+"_L_q")
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

// TestInfoRemovesAckedLeftovers: jobs acked while their stream could not write (a full disk:
// a 16 MiB tmpfs, so the test needs root) stay in the stream, even after JetStream starts
// again. Info counts only the job really waiting throughout: while the stream cannot remove
// them it leaves them out, and once it can, it removes them before it answers.
func TestInfoRemovesAckedLeftovers(t *testing.T) {
	mnt := testenv.TmpFS(t, 16)
	js := filepath.Join(mnt, "js")
	ns := testenv.NATS(t, func(o *server.Options) { o.StoreDir = js })
	b := setupURL(t, ns.URL, queue.Options{}, queue.Spec{Name: "q", MaxBytes: 4 << 20, AckWait: time.Hour})
	filler := testenv.Fill(t, filepath.Join(mnt, "filler"), 1024)
	body := bytes.Repeat([]byte("x"), 64<<10)
	stored := 0
	for ; stored < 200; stored++ {
		ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second) // the unanswered one waits that long
		_, err := b.q.Publish(ctx, &queue.Job{Queue: "q", Body: body})
		cancel()
		if err != nil {
			break
		}
	}
	if stored < 2 || stored == 200 {
		t.Fatalf("%d jobs stored before the disk filled; want some, then a failure", stored)
	}
	msgs, err := b.consumer("q").Fetch(b.ctx, stored, time.Second)
	if err != nil || len(msgs) != stored {
		t.Fatalf("fetch: %d of %d jobs, %v", len(msgs), stored, err)
	}
	for _, m := range msgs[:stored-1] { // the last one stays in flight
		if err := m.Ack(b.ctx); err != nil {
			t.Fatalf("ack while the disk is full: %v", err)
		}
	}
	// While the stream cannot remove them, Info does not count them.
	if info, err := b.q.Info(b.ctx, "q"); err != nil || info.Depth != 1 {
		t.Errorf("Info with the disk full: depth %d (%v); want 1 (the job not acked)", info.Depth, err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	// Nor after space is freed, as long as JetStream has not started again.
	if info, err := b.q.Info(b.ctx, "q"); err != nil || info.Depth != 1 {
		t.Errorf("Info after space was freed: depth %d (%v); want 1", info.Depth, err)
	}
	// JetStream started again (as nats-server's restart does): the stream writes again.
	if err := ns.Server.DisableJetStream(); err != nil {
		t.Fatal(err)
	}
	if err := ns.Server.EnableJetStream(&server.JetStreamConfig{StoreDir: js, MaxStore: 1 << 40}); err != nil {
		t.Fatal(err)
	}
	left := b.depth("q")
	if left < 2 {
		t.Fatalf("%d jobs in the stream after %d acks on a full disk; want the acked ones left over", left, stored-1)
	}
	info, err := b.q.Info(b.ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	if info.Depth != 1 || info.InFlight != 1 {
		t.Errorf("Info: depth %d, in flight %d; want 1 and 1 (the job not acked)", info.Depth, info.InFlight)
	}
	if d := b.depth("q"); d != 1 {
		t.Errorf("%d jobs in the stream after Info; want 1", d)
	}
	t.Logf("%d jobs stored, %d acked, %d left in the stream before Info", stored, stored-1, left)
	// The publish that went unanswered is withdrawn in the background, waiting for an answer
	// the old JetStream took along: stop it now rather than at the cleanup's 5 s.
	ctx, cancel := context.WithTimeout(b.ctx, 100*time.Millisecond)
	defer cancel()
	b.q.Close(ctx)
}
