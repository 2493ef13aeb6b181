package queue_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

func TestProvisionIdempotentAndReload(t *testing.T) {
	specs := []queue.Spec{{Name: "orders", MaxDepth: 10, AckWait: 5 * time.Second}, {Name: "mail"}}
	b := setup(t, queue.Options{}, specs...)
	if err := b.q.Provision(b.ctx, specs); err != nil {
		t.Fatalf("second Provision: %v", err)
	}
	st, err := b.js.Stream(b.ctx, b.stream("orders"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	if cfg.Retention != jetstream.WorkQueuePolicy || cfg.Discard != jetstream.DiscardNew || cfg.MaxMsgs != 10 ||
		cfg.Storage != jetstream.FileStorage || cfg.Replicas != 1 || cfg.Duplicates != 2*time.Minute {
		t.Fatalf("stream config %+v", cfg)
	}
	c, err := st.Consumer(b.ctx, "workers")
	if err != nil {
		t.Fatal(err)
	}
	cc := c.CachedInfo().Config
	if cc.AckPolicy != jetstream.AckExplicitPolicy || cc.AckWait != 5*time.Second || cc.MaxDeliver != -1 || cc.MaxAckPending != 1000 {
		t.Fatalf("consumer config %+v", cc)
	}

	for range 3 {
		b.publish(&queue.Job{Queue: "orders"})
	}
	// Reload with max_depth below the current depth: the jobs stay, new ones are refused.
	if err := b.q.Provision(b.ctx, []queue.Spec{{Name: "orders", MaxDepth: 2}}); err != nil {
		t.Fatal(err)
	}
	if d := b.depth("orders"); d != 3 {
		t.Fatalf("depth %d after lowering max depth, want 3 (no job dropped)", d)
	}
	_, err = b.q.Publish(b.ctx, &queue.Job{Queue: "orders"})
	wantErr(t, err, queue.ErrFull)
	// "mail" was left out: unknown to Publish, its stream kept.
	_, err = b.q.Publish(b.ctx, &queue.Job{Queue: "mail"})
	wantErr(t, err, queue.ErrUnknownQueue)
	if _, err := b.js.Stream(b.ctx, b.stream("mail")); err != nil {
		t.Fatalf("stream of a removed queue: %v", err)
	}
	// Raise it again.
	if err := b.q.Provision(b.ctx, []queue.Spec{{Name: "orders", MaxDepth: 5}}); err != nil {
		t.Fatal(err)
	}
	b.publish(&queue.Job{Queue: "orders"})

	// Invalid specs are all reported, and nothing is changed.
	err = b.q.Provision(b.ctx, []queue.Spec{{Name: "bad name"}, {Name: "x", MaxDepth: -1}, {Name: "orders"}, {Name: "orders"}})
	if err == nil {
		t.Fatal("invalid specs accepted")
	}
	for _, want := range []string{`"bad name"`, `"x"`, `duplicate`} {
		if !bytes.Contains([]byte(err.Error()), []byte(want)) {
			t.Fatalf("error %q does not mention %s", err, want)
		}
	}
	b.publish(&queue.Job{Queue: "orders"}) // still provisioned
}

func TestInfo(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "a", MaxDepth: 100}, queue.Spec{Name: "b"})
	for range 4 {
		b.publish(&queue.Job{Queue: "a", Body: []byte("12345")})
	}
	msgs, err := b.consumer("a").Fetch(b.ctx, 1, 5*time.Second)
	if err != nil || len(msgs) != 1 {
		t.Fatal(len(msgs), err)
	}
	// The consumer's pending count follows the stream's a moment later, on the server's time.
	var info queue.Info
	testenv.WaitFor(t, 5*time.Second, "the consumer counts 3 jobs pending", func() bool {
		info, err = b.q.Info(b.ctx, "a")
		return err == nil && info.Pending == 3
	})
	if info.Name != "a" || info.Depth != 4 || info.Pending != 3 || info.InFlight != 1 || info.Consumers != 1 ||
		info.DeadLetters != 0 || info.Bytes == 0 || info.MaxDepth != 100 {
		t.Fatalf("info %+v", info)
	}
	if err := b.q.DeadLetter(b.ctx, msgs[0], "gone", 410, -1); err != nil {
		t.Fatal(err)
	}
	list, err := b.q.List(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "a" || list[1].Name != "b" || list[0].Depth != 3 || list[0].DeadLetters != 1 || list[0].InFlight != 0 {
		t.Fatalf("list %+v", list)
	}
	if _, err := b.q.Info(b.ctx, "nope"); !errors.Is(err, queue.ErrUnknownQueue) {
		t.Fatalf("info of an unknown queue: %v", err)
	}
}

func TestDeadLetterAndReplay(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q"})
	body := allBytes()
	r := b.publish(&queue.Job{Queue: "q", Method: "PUT", Path: "/x?y=1", Body: body})
	other := b.publish(&queue.Job{Queue: "q", Body: []byte("other")})
	c := b.consumer("q")
	m := b.fetchOne(c, 5*time.Second)
	if m.Job.ID != r.ID {
		t.Fatalf("fetched %s, want %s", m.Job.ID, r.ID)
	}
	if err := b.q.SetStatus(b.ctx, queue.Status{ID: r.ID, State: queue.StateRunning, Attempts: 3}); err != nil {
		t.Fatal(err)
	}
	if err := b.q.DeadLetter(b.ctx, m, "upstream answered 422", 422, -1); err != nil {
		t.Fatal(err)
	}
	if d := b.depth("q"); d != 1 {
		t.Fatalf("depth %d after dead-lettering one of two, want 1", d)
	}
	st, err := b.q.Status(b.ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != queue.StateFailed || !st.DeadLetter || st.Attempts != 3 || st.LastError != "upstream answered 422" ||
		st.Response == nil || st.Response.Status != 422 {
		t.Fatalf("status after dead letter: %+v", st)
	}

	dls, err := b.q.DeadLetters(b.ctx, "q", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dls))
	}
	dl := dls[0]
	if dl.Job.ID != r.ID || !bytes.Equal(dl.Job.Body, body) || dl.Job.Method != "PUT" || dl.Job.Path != "/x?y=1" ||
		dl.Reason != "upstream answered 422" || dl.LastStatus != 422 || dl.Attempts != 3 || dl.FailedAt.IsZero() {
		t.Fatalf("dead letter %+v", dl)
	}
	if _, err := b.q.DeadLetters(b.ctx, "nope", 10); !errors.Is(err, queue.ErrUnknownQueue) {
		t.Fatalf("dead letters of an unknown queue: %v", err)
	}

	if err := b.q.Replay(b.ctx, "q", r.ID); err != nil {
		t.Fatal(err)
	}
	if info, _ := b.q.Info(b.ctx, "q"); info.DeadLetters != 0 || info.Depth != 2 {
		t.Fatalf("after replay: %+v", info)
	}
	if st, _ := b.q.Status(b.ctx, r.ID); st.State != queue.StateQueued || st.DeadLetter || st.Attempts != 0 {
		t.Fatalf("status after replay: %+v", st)
	}
	wantErr(t, b.q.Replay(b.ctx, "q", r.ID), queue.ErrNotFound)

	seen := map[string][]byte{}
	for range 2 {
		m := b.fetchOne(c, 5*time.Second)
		seen[m.Job.ID] = m.Job.Body
		if err := m.Ack(b.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(seen[r.ID], body) || string(seen[other.ID]) != "other" {
		t.Fatalf("after replay the queue held %d jobs: %v", len(seen), seen)
	}
}

// Dead-lettering one job twice (a crash between the dead-letter publish and the ack, then a
// redelivery) keeps one dead letter; a stale delivery of a job that succeeded is not
// dead-lettered at all.
func TestDeadLetterTwiceStoresOne(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q", AckWait: 200 * time.Millisecond})
	r := b.publish(&queue.Job{Queue: "q"})
	c := b.consumer("q")
	first := b.fetchOne(c, 5*time.Second)
	second := b.fetchOne(c, 5*time.Second) // redelivered after AckWait: first is now stale
	if second.Job.ID != r.ID || second.Delivered != 2 {
		t.Fatalf("redelivery %s #%d", second.Job.ID, second.Delivered)
	}
	if err := b.q.DeadLetter(b.ctx, second, "500 x8", 500, -1); err != nil {
		t.Fatal(err)
	}
	_ = b.q.DeadLetter(b.ctx, first, "500 x8", 500, -1)
	dls, err := b.q.DeadLetters(b.ctx, "q", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || dls[0].Job.ID != r.ID {
		t.Fatalf("%d dead letters, want 1", len(dls))
	}
	if d := b.depth("q"); d != 0 {
		t.Fatalf("depth %d, want 0", d)
	}

	ok := b.publish(&queue.Job{Queue: "q"})
	stale := b.fetchOne(c, 5*time.Second)
	fresh := b.fetchOne(c, 5*time.Second)
	if err := b.q.SetStatus(b.ctx, queue.Status{ID: ok.ID, State: queue.StateSucceeded, Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	if err := fresh.Ack(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.q.DeadLetter(b.ctx, stale, "timeout", 0, -1); err != nil {
		t.Fatal(err)
	}
	if dls, _ := b.q.DeadLetters(b.ctx, "q", 10); len(dls) != 1 {
		t.Fatalf("a succeeded job was dead-lettered: %d dead letters", len(dls))
	}
	if st, _ := b.q.Status(b.ctx, ok.ID); st.State != queue.StateSucceeded {
		t.Fatalf("status %+v", st)
	}
}

// The attempts a caller gives DeadLetter are recorded even when the status it finds lags behind
// (a worker that skipped recording its last, fast attempt) or says none were spent (a job that
// only ever met pause retries).
func TestDeadLetterRecordsCallersAttempts(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q"})
	for _, tc := range []struct{ recorded, given int }{{recorded: 2, given: 3}, {recorded: 0, given: 0}} {
		r := b.publish(&queue.Job{Queue: "q", Body: []byte("x")})
		m := b.fetchOne(b.consumer("q"), 5*time.Second)
		if m.Job.ID != r.ID {
			t.Fatalf("fetched %s, want %s", m.Job.ID, r.ID)
		}
		if err := b.q.SetStatus(b.ctx, queue.Status{ID: r.ID, Queue: "q", State: queue.StateRetrying, Attempts: tc.recorded}); err != nil {
			t.Fatal(err)
		}
		if err := b.q.DeadLetter(b.ctx, m, "gave up", 503, tc.given); err != nil {
			t.Fatal(err)
		}
		st, err := b.q.Status(b.ctx, r.ID)
		if err != nil {
			t.Fatal(err)
		}
		dls, err := b.q.DeadLetters(b.ctx, "q", 10)
		if err != nil {
			t.Fatal(err)
		}
		var dl *queue.DeadLetter
		for i := range dls {
			if dls[i].Job.ID == r.ID {
				dl = &dls[i]
			}
		}
		if st.Attempts != tc.given || dl == nil || dl.Attempts != tc.given {
			t.Fatalf("recorded %d, gave %d: status attempts %d, dead letter %+v", tc.recorded, tc.given, st.Attempts, dl)
		}
	}
}

// A queue's dead-letter stream is made by its first dead letter, not by Provision: until then
// every reader treats it as empty.
func TestDeadLetterStreamOnDemand(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q"})
	b.noStream("_DLQ_q")
	info, err := b.q.Info(b.ctx, "q")
	if err != nil || info.DeadLetters != 0 {
		t.Fatalf("info: %+v, %v", info, err)
	}
	if dl, err := b.q.DeadLetters(b.ctx, "q", 0); err != nil || len(dl) != 0 {
		t.Fatalf("dead letters: %v, %v", dl, err)
	}
	if page, err := b.q.Browse(b.ctx, "q", queue.BrowseQuery{Source: queue.SourceDead}); err != nil || len(page.Jobs) != 0 {
		t.Fatalf("browse: %+v, %v", page, err)
	}
	if n, err := b.q.PurgeDeadLetters(b.ctx, "q", nil); err != nil || n != 0 {
		t.Fatalf("purge: %d, %v", n, err)
	}
	r := b.publish(&queue.Job{Queue: "q", Body: []byte("x")})
	if err := b.q.Replay(b.ctx, "q", r.ID); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("replay without a dead-letter stream: %v", err)
	}
}

// The first dead letter makes the stream; a later Provision keeps it up to date.
func TestDeadLetterStreamMadeAndUpdated(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q"})
	b.publish(&queue.Job{Queue: "q", Body: []byte("x")})
	if err := b.q.DeadLetter(b.ctx, b.fetchOne(b.consumer("q"), 5*time.Second), "gone", 410, -1); err != nil {
		t.Fatal(err)
	}
	if info, err := b.q.Info(b.ctx, "q"); err != nil || info.DeadLetters != 1 {
		t.Fatalf("info after a dead letter: %+v, %v", info, err)
	}
	opts := b.opts
	opts.DeadLetterMaxAge = time.Hour
	setupURL(t, b.url, opts, queue.Spec{Name: "q"})
	st, err := b.js.Stream(b.ctx, b.prefix+"_DLQ_q")
	if err != nil || st.CachedInfo().Config.MaxAge != time.Hour || st.CachedInfo().State.Msgs != 1 {
		t.Fatalf("dead-letter stream after a changed Provision: %v", err)
	}
}
