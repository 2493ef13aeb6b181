package queue_test

import (
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"net/http"
	"slices"
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
	waiting, _, err := b.q.Waiting(b.ctx)
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

// TestFormerStreams: a queue whose jobs wait in its own stream becomes shared (another
// process turns shared_streams on); its own stream is its former stream, drained through
// FormerConsumer and then retired (a publish to its old subjects fails, the stream goes);
// then, with another count, and then with no shared streams at all, its former shared
// stream's consumer (made for jobs that had none) is drained and deleted, while a job still
// unacknowledged keeps it, and it delivers again after that refusal.
func TestFormerStreams(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "s"})
	job := func() *queue.Job { return &queue.Job{Queue: "s", Method: http.MethodPost, Path: "/x"} }
	own := map[string]bool{}
	for range 3 {
		own[b.publish(job()).ID] = true
	}
	// The same deployment with shared streams: a count under which "s" moves each time.
	counts := []int{2, 3, 5, 7}
	slot := func(n int) int { h := fnv.New32a(); h.Write([]byte("s")); return int(h.Sum32() % uint32(n)) }
	first, second := counts[0], 0
	for _, n := range counts[1:] {
		if slot(n) != slot(first) {
			second = n
			break
		}
	}
	if second == 0 {
		t.Fatal("no count moves the queue")
	}
	sh := reopen(t, b, first)
	if !sh.Shared("s") {
		t.Fatal(`"s" is not shared`)
	}
	_, formers, err := sh.Waiting(b.ctx)
	if err != nil || !slices.Equal(formers["s"], []string{b.stream("s")}) {
		t.Fatalf("formers: %v, %v; want s's own stream", formers, err)
	}
	// A job waiting in the former stream is read, and canceled, there.
	var ownIDs []string
	for id := range own {
		ownIDs = append(ownIDs, id)
	}
	if st, err := sh.Status(b.ctx, ownIDs[0]); err != nil || st.State != queue.StateQueued || st.Queue != "s" {
		t.Fatalf("status of a job in the former stream: %+v, %v", st, err)
	}
	if _, err := sh.Cancel(b.ctx, ownIDs[1]); err != nil {
		t.Fatalf("cancel of a job in the former stream: %v", err)
	}
	delete(own, ownIDs[1])
	if d := b.depth("s"); d != 2 {
		t.Fatalf("the own stream holds %d jobs after a cancel; want 2", d)
	}
	shared := map[string]bool{}
	for range 2 {
		r, err := sh.Publish(b.ctx, job())
		if err != nil {
			t.Fatal(err)
		}
		shared[r.ID] = true
	}
	fc, err := sh.FormerConsumer(b.ctx, "s", b.stream("s"))
	if err != nil {
		t.Fatal(err)
	}
	if gone, err := sh.RetireFormer(b.ctx, "s", b.stream("s")); gone || err != nil {
		t.Fatalf("retire a former stream that holds jobs: %v, %v", gone, err)
	}
	for range len(own) {
		m := b.fetchOne(fc, time.Second)
		if !own[m.Job.ID] {
			t.Fatalf("job %s from the own stream: not one published there", m.Job.ID)
		}
		if err := m.Ack(b.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if gone, err := sh.RetireFormer(b.ctx, "s", b.stream("s")); !gone || err != nil {
		t.Fatalf("retire the drained own stream: %v, %v", gone, err)
	}
	b.noStream("_Q_s")
	if _, formers, err := sh.Waiting(b.ctx); err != nil || len(formers) != 0 {
		t.Fatalf("formers after the retirement: %v, %v", formers, err)
	}
	if _, err := b.js.Publish(b.ctx, b.subject("s")+".late", nil); err == nil {
		t.Fatal("a publish to the retired stream's subject was stored")
	}

	// Another count: the jobs stored under the first, which no consumer took yet, are found by
	// their subjects in the former shared stream.
	sh2 := reopen(t, b, second)
	oldStream := fmt.Sprintf("%s_J_%d", b.prefix, slot(first))
	_, formers, err = sh2.Waiting(b.ctx)
	if err != nil || !slices.Equal(formers["s"], []string{oldStream}) {
		t.Fatalf("formers after a count change: %v, %v; want %s", formers, err, oldStream)
	}
	for id := range shared {
		if st, err := sh2.Status(b.ctx, id); err != nil || st.State != queue.StateQueued {
			t.Fatalf("status of a job in the former shared stream: %+v, %v", st, err)
		}
	}
	fc, err = sh2.FormerConsumer(b.ctx, "s", oldStream)
	if err != nil {
		t.Fatal(err)
	}
	held := b.fetchOne(fc, time.Second)
	if gone, err := sh2.RetireFormer(b.ctx, "s", oldStream); gone || err != nil {
		t.Fatalf("retire a former consumer with a job unacknowledged: %v, %v", gone, err)
	}
	if err := held.Nak(b.ctx); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for len(got) < 2 {
		m := b.fetchOne(fc, 2*time.Second) // resumed after the refusal
		got[m.Job.ID] = true
		if err := m.Ack(b.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !maps.Equal(got, shared) {
		t.Fatalf("jobs from the former shared stream: %v, want %v", got, shared)
	}
	if gone, err := sh2.RetireFormer(b.ctx, "s", oldStream); !gone || err != nil {
		t.Fatalf("retire the drained former consumer: %v, %v", gone, err)
	}
	if _, err := b.js.Consumer(b.ctx, oldStream, "s"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("former consumer after its retirement: %v", err)
	}

	// No shared streams: a job stored under the second count is found, and drained, from its
	// consumer.
	r, err := sh2.Publish(b.ctx, job())
	if err != nil {
		t.Fatal(err)
	}
	plain := reopen(t, b, 0)
	newStream := fmt.Sprintf("%s_J_%d", b.prefix, slot(second))
	_, formers, err = plain.Waiting(b.ctx)
	if err != nil || !slices.Equal(formers["s"], []string{newStream}) {
		t.Fatalf("formers with no shared streams: %v, %v; want %s", formers, err, newStream)
	}
	fc, err = plain.FormerConsumer(b.ctx, "s", newStream)
	if err != nil {
		t.Fatal(err)
	}
	if m := b.fetchOne(fc, time.Second); m.Job.ID != r.ID {
		t.Fatalf("job %s, want %s", m.Job.ID, r.ID)
	} else if err := m.Ack(b.ctx); err != nil {
		t.Fatal(err)
	}
	if gone, err := plain.RetireFormer(b.ctx, "s", newStream); !gone || err != nil {
		t.Fatalf("retire: %v, %v", gone, err)
	}
}

// reopen returns a Queues over b's prefix with n shared streams, "s" provisioned.
func reopen(t *testing.T, b *bundle, n int) *queue.Queues {
	t.Helper()
	q, err := queue.New(b.ctx, b.js, queue.Options{Prefix: b.prefix, SharedStreams: n})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Provision(b.ctx, []queue.Spec{{Name: "s"}}); err != nil {
		t.Fatalf("provision with %d shared streams: %v", n, err)
	}
	return q
}

// A queue no worker serves (no consumer) with jobs in a shared stream: the scan counts them
// by the queue's tickets, not by listing the stream's subjects (one per job, built under the
// stream's lock), at every scan, as another queue of the stream drains through its consumer,
// and after a job of the unserved queue is stored or canceled. It reads no job of the stream.
func TestSharedScanCountsByTickets(t *testing.T) {
	b := setup(t, queue.Options{SharedStreams: 1}, queue.Spec{Name: "a"}, queue.Spec{Name: "b"})
	job := func(q string) *queue.Job {
		return &queue.Job{Queue: q, Method: http.MethodPost, Path: "/x", Body: []byte("x")}
	}
	const jobs = 50
	for range jobs {
		b.publish(job("a"))
	}
	scan := func(wantA, wantB int) {
		t.Helper()
		waiting, _, err := b.q.Waiting(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if int(waiting["a"]) != wantA || int(waiting["b"]) != wantB {
			t.Fatalf("waiting %v; want a: %d, b: %d", waiting, wantA, wantB)
		}
		if got := queue.FormerProbes(b.q); got != 0 {
			t.Fatalf("%d reads of jobs in former streams; want none (no former stream)", got)
		}
	}
	scan(jobs, 0)
	scan(jobs, 0)

	// b drains through its consumer beside a's backlog.
	for range 5 {
		b.publish(job("b"))
	}
	c := b.consumer("b")
	scan(jobs, 5) // b's jobs counted by its consumer
	for i := 4; i >= 0; i-- {
		m := b.fetchOne(c, time.Second)
		if err := m.Ack(b.ctx); err != nil {
			t.Fatal(err)
		}
		// The ticket's release follows the ack: b's depth is its consumer's, whatever its ledger.
		scan(jobs, i)
	}

	r := b.publish(job("a"))
	scan(jobs+1, 0)
	if _, err := b.q.Cancel(b.ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	scan(jobs, 0)
}

// TestSharedScanListsOnlyItsQueues: a worker's scan reports the queues it provisioned only: a
// queue it does not serve (another process's config, or no worker's), with a backlog in the
// same stream, is neither reported nor read, whatever its jobs do.
func TestSharedScanListsOnlyItsQueues(t *testing.T) {
	// pub knows every queue, as an ingress does; b is a worker whose config lacks "unserved".
	pub := setup(t, queue.Options{SharedStreams: 1}, queue.Spec{Name: "a"}, queue.Spec{Name: "b"}, queue.Spec{Name: "unserved"})
	b := setupURL(t, pub.url, pub.opts, queue.Spec{Name: "a"}, queue.Spec{Name: "b"})
	job := func(q string) *queue.Job {
		return &queue.Job{Queue: q, Method: http.MethodPost, Path: "/x", Body: []byte("x")}
	}
	const backlog = 300
	for range backlog {
		pub.publish(job("unserved"))
	}
	for range 3 {
		b.publish(job("a"))
	}
	scan := func(wantA, wantB int) {
		t.Helper()
		waiting, _, err := b.q.Waiting(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if int(waiting["a"]) != wantA || int(waiting["b"]) != wantB || waiting["unserved"] != 0 {
			t.Fatalf("waiting %v; want a: %d, b: %d and not unserved", waiting, wantA, wantB)
		}
		if got := queue.FormerProbes(b.q); got != 0 {
			t.Fatalf("%d reads of jobs in former streams; want none", got)
		}
	}
	scan(3, 0)
	b.publish(job("b"))
	scan(3, 1)
	b.consumer("a")
	b.consumer("b")
	scan(3, 1)
	pub.publish(job("unserved"))
	scan(3, 1)
	// The ingress counts the unserved backlog, by its tickets.
	counts, err := pub.q.Counts(pub.ctx, false)
	if err != nil || counts["unserved"].Depth != backlog+1 || counts["a"].Depth != 3 {
		t.Fatalf("the ingress's counts: %+v, %v; want unserved at %d, a at 3", counts, err, backlog+1)
	}
}
