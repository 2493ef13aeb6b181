package queue_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// sharedMsgs is the number of messages of queue name in shared stream J_0 (Options.SharedStreams 1).
func (b *bundle) sharedMsgs(name string) uint64 {
	b.t.Helper()
	st, err := b.js.Stream(b.ctx, b.prefix+"_J_0")
	if err != nil {
		b.t.Fatal(err)
	}
	si, err := st.Info(b.ctx, jetstream.WithSubjectFilter(b.prefix+".j.0."+name+".>"))
	if err != nil {
		b.t.Fatal(err)
	}
	var n uint64
	for _, c := range si.State.Subjects {
		n += c
	}
	return n
}

// TestSharedLeftoversFinal: two queues in one shared stream; of a's three jobs delivered and
// not acked (AckWait an hour), the one recorded succeeded by a worker that then died is
// removed, not before its record is old enough; a's running one, a's waiting one and b's jobs
// (one delivered, without a record) stay.
func TestSharedLeftoversFinal(t *testing.T) {
	b := setup(t, queue.Options{SharedStreams: 1}, queue.Spec{Name: "a", AckWait: time.Hour}, queue.Spec{Name: "b", AckWait: time.Hour})
	var ids []string
	for range 3 {
		ids = append(ids, b.publish(&queue.Job{Queue: "a", Body: []byte("job")}).ID)
	}
	b.publish(&queue.Job{Queue: "b", Body: []byte("job")})
	b.publish(&queue.Job{Queue: "b", Body: []byte("job")})
	if msgs, err := b.consumer("a").Fetch(b.ctx, 2, time.Second); err != nil || len(msgs) != 2 {
		t.Fatalf("fetch a: %d jobs, %v", len(msgs), err)
	}
	if msgs, err := b.consumer("b").Fetch(b.ctx, 1, time.Second); err != nil || len(msgs) != 1 {
		t.Fatalf("fetch b: %d jobs, %v", len(msgs), err)
	}
	for id, state := range map[string]queue.State{ids[0]: queue.StateSucceeded, ids[1]: queue.StateRunning} {
		if err := b.q.SetStatus(b.ctx, queue.Status{ID: id, Queue: "a", State: state, Attempts: 1}); err != nil {
			t.Fatal(err)
		}
	}
	from := map[string]uint64{}
	if removed, err := b.q.RemoveSharedLeftovers(b.ctx, from, 10); err != nil || len(removed) != 0 {
		t.Fatalf("with the final record fresh: removed %v, %v; want none", removed, err)
	}
	queue.SetClock(b.q, func() time.Time { return time.Now().Add(10 * time.Second) })
	removed, err := b.q.RemoveSharedLeftovers(b.ctx, from, 10)
	if err != nil || len(removed) != 1 || removed["a"] != 1 {
		t.Fatalf("removed %v, %v; want a's one", removed, err)
	}
	if a, bb := b.sharedMsgs("a"), b.sharedMsgs("b"); a != 2 || bb != 2 {
		t.Fatalf("left: a %d, b %d; want 2 and 2", a, bb)
	}
	if _, err := b.q.Status(b.ctx, ids[2]); err != nil {
		t.Fatalf("status of a's waiting job: %v", err)
	}
}

// TestSharedLeftoversAcked: jobs of queue a acked while the shared stream could not write (a
// full disk: a 16 MiB tmpfs, so the test needs root) stay in it after JetStream starts again;
// a pass removes them by a's subjects, and neither a's job in flight nor b's waiting job.
func TestSharedLeftoversAcked(t *testing.T) {
	mnt := testenv.TmpFS(t, 16)
	js := filepath.Join(mnt, "js")
	ns := testenv.NATS(t, func(o *server.Options) { o.StoreDir = js })
	b := setupURL(t, ns.URL, queue.Options{SharedStreams: 1}, queue.Spec{Name: "a", AckWait: time.Hour}, queue.Spec{Name: "b"})
	b.publish(&queue.Job{Queue: "b", Body: []byte("waits")})
	filler := testenv.Fill(t, filepath.Join(mnt, "filler"), 1024)
	body := bytes.Repeat([]byte("x"), 64<<10)
	stored := 0
	for ; stored < 200; stored++ {
		ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
		_, err := b.q.Publish(ctx, &queue.Job{Queue: "a", Body: body})
		cancel()
		if err != nil {
			break
		}
	}
	if stored < 2 || stored == 200 {
		t.Fatalf("%d jobs stored before the disk filled; want some, then a failure", stored)
	}
	msgs, err := b.consumer("a").Fetch(b.ctx, stored, time.Second)
	if err != nil || len(msgs) != stored {
		t.Fatalf("fetch: %d of %d jobs, %v", len(msgs), stored, err)
	}
	for _, m := range msgs[:stored-1] { // the last one stays in flight
		if err := m.Ack(b.ctx); err != nil {
			t.Fatalf("ack while the disk is full: %v", err)
		}
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := ns.Server.DisableJetStream(); err != nil {
		t.Fatal(err)
	}
	if err := ns.Server.EnableJetStream(&server.JetStreamConfig{StoreDir: js, MaxStore: 1 << 40}); err != nil {
		t.Fatal(err)
	}
	left := b.sharedMsgs("a")
	if left < 2 {
		t.Fatalf("%d of a's jobs in the stream after %d acks on a full disk; want the acked ones left over", left, stored-1)
	}
	removed, err := b.q.RemoveSharedLeftovers(b.ctx, map[string]uint64{}, 10)
	if err != nil || removed["a"] != int(left-1) || len(removed) != 1 {
		t.Fatalf("removed %v, %v; want a's %d acked ones", removed, err, left-1)
	}
	if a, bb := b.sharedMsgs("a"), b.sharedMsgs("b"); a != 1 || bb != 1 {
		t.Fatalf("left: a %d, b %d; want 1 (in flight) and 1 (waiting)", a, bb)
	}
	t.Logf("%d jobs stored, %d acked, %d left in the stream before the pass", stored, stored-1, left)
	ctx, cancel := context.WithTimeout(b.ctx, 100*time.Millisecond)
	defer cancel()
	b.q.Close(ctx)
}
