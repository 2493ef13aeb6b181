package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

func TestFetchEmptyAndBatch(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q"})
	c := b.consumer("q")
	start := time.Now()
	msgs, err := c.Fetch(b.ctx, 5, 100*time.Millisecond)
	if err != nil || len(msgs) != 0 {
		t.Fatalf("fetch on an empty queue: %d jobs, %v", len(msgs), err)
	}
	if el := time.Since(start); el < 80*time.Millisecond || el > 3*time.Second {
		t.Fatalf("empty fetch with wait 100ms took %v", el)
	}
	if msgs, err := c.Fetch(b.ctx, 5, 0); err != nil || len(msgs) != 0 {
		t.Fatalf("no-wait fetch on an empty queue: %d jobs, %v", len(msgs), err)
	}
	for range 3 {
		b.publish(&queue.Job{Queue: "q"})
	}
	// A full batch returns at once, not after the wait.
	start = time.Now()
	msgs, err = c.Fetch(b.ctx, 2, 10*time.Second)
	if err != nil || len(msgs) != 2 {
		t.Fatalf("fetch 2 of 3: %d jobs, %v", len(msgs), err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("a full batch waited %v", el)
	}
	// Another worker's handle gets the rest, not the same jobs.
	other, err := b.consumer("q").Fetch(b.ctx, 5, 0)
	if err != nil || len(other) != 1 || other[0].Job.ID == msgs[0].Job.ID || other[0].Job.ID == msgs[1].Job.ID {
		t.Fatalf("second fetch: %d jobs, %v", len(other), err)
	}
	// A cancelled context ends a wait.
	ctx, cancel := context.WithCancel(b.ctx)
	cancel()
	if _, err := c.Fetch(ctx, 1, 10*time.Second); !errors.Is(err, context.Canceled) {
		t.Fatalf("fetch with a cancelled context: %v", err)
	}
	if _, err := b.q.Consumer(b.ctx, "nope"); !errors.Is(err, queue.ErrUnknownQueue) {
		t.Fatalf("consumer of an unknown queue: %v", err)
	}
}

func TestNakWithDelay(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q"})
	r := b.publish(&queue.Job{Queue: "q", Body: []byte("again")})
	c := b.consumer("q")
	m := b.fetchOne(c, 5*time.Second)
	const delay = 400 * time.Millisecond
	naked := time.Now()
	if err := m.NakWithDelay(b.ctx, delay); err != nil {
		t.Fatal(err)
	}
	if err := m.Ack(b.ctx); err == nil {
		t.Fatal("ack after nak succeeded")
	}
	if msgs, err := c.Fetch(b.ctx, 1, 0); err != nil || len(msgs) != 0 {
		t.Fatalf("job redelivered at once after NakWithDelay: %d jobs, %v", len(msgs), err)
	}
	again := b.fetchOne(c, 10*time.Second)
	el := time.Since(naked)
	if el < delay-50*time.Millisecond || el > delay+3*time.Second {
		t.Fatalf("redelivered after %v, want about %v", el, delay)
	}
	if again.Job.ID != r.ID || again.Delivered != 2 || string(again.Job.Body) != "again" {
		t.Fatalf("redelivery: id %s delivered %d body %q", again.Job.ID, again.Delivered, again.Job.Body)
	}
	// Nak hands it back at once, as on shutdown.
	if err := again.Nak(b.ctx); err != nil {
		t.Fatal(err)
	}
	third := b.fetchOne(c, 5*time.Second)
	if third.Delivered != 3 {
		t.Fatalf("delivered %d, want 3", third.Delivered)
	}
	if err := third.Ack(b.ctx); err != nil {
		t.Fatal(err)
	}
}

func TestAckWaitAndInProgress(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q", AckWait: 300 * time.Millisecond})
	b.publish(&queue.Job{Queue: "q"})
	c := b.consumer("q")
	m := b.fetchOne(c, 5*time.Second)
	// Keep it past several AckWaits with InProgress: no one else gets it.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if err := m.InProgress(b.ctx); err != nil {
			t.Fatal(err)
		}
		if msgs, err := c.Fetch(b.ctx, 1, 100*time.Millisecond); err != nil || len(msgs) != 0 {
			t.Fatalf("job held with InProgress was redelivered (%d, %v)", len(msgs), err)
		}
	}
	// Then let it go silent: JetStream redelivers it after AckWait.
	again := b.fetchOne(c, 5*time.Second)
	if again.Delivered != 2 {
		t.Fatalf("delivered %d, want 2", again.Delivered)
	}
}

// AckNoWait settles the job like Ack: once the connection has flushed it, the job is gone from
// the queue and not redelivered after AckWait; settling it again is an error.
func TestAckNoWait(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q", AckWait: 300 * time.Millisecond})
	b.publish(&queue.Job{Queue: "q"})
	c := b.consumer("q")
	m := b.fetchOne(c, 5*time.Second)
	if err := m.AckNoWait(); err != nil {
		t.Fatal(err)
	}
	if err := m.AckNoWait(); err == nil {
		t.Fatal("a second AckNoWait succeeded")
	}
	if err := m.Nak(b.ctx); err == nil {
		t.Fatal("nak after AckNoWait succeeded")
	}
	// A flush's round trip follows the ack to the server, which processes a connection's
	// messages in order.
	if err := b.nc.FlushWithContext(b.ctx); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the acked job to leave the stream", func() bool { return b.depth("q") == 0 })
	// Well past AckWait: had the ack been lost, the job would be back.
	if msgs, err := c.Fetch(b.ctx, 1, time.Second); err != nil || len(msgs) != 0 {
		t.Fatalf("job redelivered after AckNoWait: %d jobs, %v", len(msgs), err)
	}
}

func TestStatus(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q"})
	if _, err := b.q.Status(b.ctx, queue.NewJobID("q")); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
	if _, err := b.q.Status(b.ctx, "not a valid.id"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("invalid id: %v", err)
	}
	r := b.publish(&queue.Job{Queue: "q"})
	queued, err := b.q.Status(b.ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.q.SetStatus(b.ctx, queue.Status{ID: r.ID, State: queue.StateRetrying, Attempts: 2,
		LastError: "upstream 502", Response: &queue.Response{Status: 502}}); err != nil {
		t.Fatal(err)
	}
	st, err := b.q.Status(b.ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != queue.StateRetrying || st.Attempts != 2 || st.Queue != "q" || !st.CreatedAt.Equal(queued.CreatedAt) ||
		st.UpdatedAt.Before(queued.UpdatedAt) || st.Response == nil || st.Response.Status != 502 {
		t.Fatalf("after SetStatus: %+v", st)
	}
	// The JSON form is the contract's GET /v1/jobs/{id} body.
	var doc map[string]any
	raw, _ := json.Marshal(st)
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"id", "queue", "state", "attempts", "created_at", "updated_at", "last_error", "response"} {
		if _, ok := doc[k]; !ok {
			t.Fatalf("status JSON %s lacks %q", raw, k)
		}
	}
	if doc["state"] != "retrying" || doc["response"].(map[string]any)["status"] != 502.0 {
		t.Fatalf("status JSON %s", raw)
	}
	if strings.Contains(string(raw), "fingerprint") {
		t.Fatalf("status JSON leaks the internal fingerprint: %s", raw)
	}

	// Succeeded sticks: a stale worker's later update does not move it back.
	if err := b.q.SetStatus(b.ctx, queue.Status{ID: r.ID, State: queue.StateSucceeded, Attempts: 3,
		Response: &queue.Response{Status: 201}}); err != nil {
		t.Fatal(err)
	}
	if err := b.q.SetStatus(b.ctx, queue.Status{ID: r.ID, State: queue.StateRunning, Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	if st, _ := b.q.Status(b.ctx, r.ID); st.State != queue.StateSucceeded || st.Attempts != 3 {
		t.Fatalf("succeeded job moved back: %+v", st)
	}
	if err := b.q.SetStatus(b.ctx, queue.Status{ID: "bad.id", State: queue.StateRunning}); err == nil {
		t.Fatal("SetStatus accepted an invalid id")
	}
}

func TestStatusExpires(t *testing.T) {
	b := setup(t, queue.Options{StatusTTL: 300 * time.Millisecond},
		queue.Spec{Name: "q", DedupeWindow: 200 * time.Millisecond})
	kv, err := b.js.KeyValue(b.ctx, b.prefix+"_STATUS")
	if err != nil {
		t.Fatal(err)
	}
	kvs, err := kv.Status(b.ctx)
	if err != nil || kvs.TTL() != 300*time.Millisecond {
		t.Fatalf("bucket TTL %v (%v), want StatusTTL", kvs.TTL(), err)
	}
	r := b.publish(&queue.Job{Queue: "q", IdempotencyKey: "k"})
	if _, err := b.q.Status(b.ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "status to expire", func() bool {
		_, err := b.q.Status(b.ctx, r.ID)
		return errors.Is(err, queue.ErrNotFound)
	})

	// A dedupe window longer than StatusTTL keeps entries that long.
	if err := b.q.Provision(b.ctx, []queue.Spec{{Name: "q", DedupeWindow: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	if kvs, err := kv.Status(b.ctx); err != nil || kvs.TTL() != time.Hour {
		t.Fatalf("bucket TTL %v (%v), want the dedupe window 1h", kvs.TTL(), err)
	}
}

func TestPoisonMessageIsDeadLettered(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q"})
	// Its own JetStream headers must not leak into the dead letter's publish.
	if _, err := b.js.Publish(b.ctx, b.subject("q"), []byte("not a job"),
		jetstream.WithMsgID("poison"), jetstream.WithExpectStream(b.stream("q"))); err != nil {
		t.Fatal(err)
	}
	good := b.publish(&queue.Job{Queue: "q"})
	msgs, err := b.consumer("q").Fetch(b.ctx, 2, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 || msgs[0].Job.ID != good.ID {
		t.Fatalf("fetch returned %d jobs, want only the good one", len(msgs))
	}
	dls, err := b.q.DeadLetters(b.ctx, "q", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || string(dls[0].Job.Body) != "not a job" || !strings.Contains(dls[0].Reason, "undecodable") {
		t.Fatalf("dead letters: %+v", dls)
	}
}
