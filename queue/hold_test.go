package queue_test

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// jsState reads, in process (not through JetStream's API, which would count), the server's
// API request count and how many tickets stream holds.
func jsState(t *testing.T, ns *testenv.NATSServer, stream string) (apiTotal, msgs uint64) {
	t.Helper()
	info, err := ns.Server.Jsz(&server.JSzOptions{Accounts: true, Streams: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range info.AccountDetails {
		for _, s := range a.Streams {
			if s.Name == stream {
				msgs = s.State.Msgs
			}
		}
	}
	return info.API.Total, msgs
}

// waitTickets waits until stream holds want tickets, and returns the API request count then.
func waitTickets(t *testing.T, ns *testenv.NATSServer, stream string, want uint64) uint64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		api, n := jsState(t, ns, stream)
		if n == want {
			return api
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %d tickets, want %d", stream, n, want)
		}
		time.Sleep(5 * time.Millisecond) // polling the condition, in process
	}
}

// A drain releases its jobs' tickets by the hold consumer's acknowledgements: 300 jobs acked,
// their tickets gone, and JetStream's API asked nothing per job (a DeleteMsg per ticket, the
// release before the hold consumer, would be 300 requests), nor did any release fall back.
func TestReleaseByAckSendsNoAPIRequests(t *testing.T) {
	ns := testenv.NATS(t)
	b := setupURL(t, ns.URL, queue.Options{}, queue.Spec{Name: "q", MaxDepth: 1000})
	const jobs = 300
	for range jobs {
		b.publish(&queue.Job{Queue: "q", Direct: true, Body: []byte("x")})
	}
	ledger := b.prefix + "_L_q"
	waitTickets(t, ns, ledger, jobs)
	c := b.consumer("q")
	before, _ := jsState(t, ns, ledger)
	for got := 0; got < jobs; {
		msgs, err := c.Fetch(b.ctx, 100, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if err := m.Ack(b.ctx); err != nil {
				t.Fatal(err)
			}
		}
		got += len(msgs)
	}
	after := waitTickets(t, ns, ledger, 0)
	t.Logf("%d jobs drained: %d JetStream API requests, %d releases fell back to deletion",
		jobs, after-before, b.q.ReleaseFallbacks())
	if after-before > jobs/30 {
		t.Errorf("the drain of %d jobs sent %d JetStream API requests; want none per job", jobs, after-before)
	}
	if n := b.q.ReleaseFallbacks(); n != 0 {
		t.Errorf("%d releases fell back to deletion; want 0", n)
	}
	// The ledger still bounds: max_depth 1000 admits 1000 again, not more.
	for range 1000 {
		b.publish(&queue.Job{Queue: "q", Direct: true})
	}
	_, err := b.q.Publish(b.ctx, &queue.Job{Queue: "q", Direct: true})
	wantErr(t, err, queue.ErrFull)
}

// A ticket its hold consumer has not delivered (no process subscribed to the holds'
// deliveries when the ledger was made) is not released by an acknowledgement, which the
// server ignores unanswered: the release falls back to deletion after its wait, and the
// ticket leaves all the same, after the job's ack and not before.
func TestReleaseFallsBackWhenTicketNotHeld(t *testing.T) {
	ns := testenv.NATS(t)
	b := setupURL(t, ns.URL, queue.Options{}, queue.Spec{Name: "q", MaxDepth: 10})
	queue.DropHold(b.q, 200*time.Millisecond)
	b.publish(&queue.Job{Queue: "q", Direct: true, Body: []byte("x")})
	ledger := b.prefix + "_L_q"
	waitHold(t, b, ledger, 0, 1) // the ticket undelivered
	m := b.fetchOne(b.consumer("q"), 5*time.Second)
	if _, n := jsState(t, ns, ledger); n != 1 {
		t.Fatalf("the ledger holds %d tickets before the ack, want 1", n)
	}
	if err := m.Ack(b.ctx); err != nil {
		t.Fatal(err)
	}
	waitTickets(t, ns, ledger, 0)
	if n := b.q.ReleaseFallbacks(); n != 1 {
		t.Errorf("%d releases fell back to deletion; want 1", n)
	}
}

// A job accepted before the upgrade carries a ticket of the old limits-retention ledger
// (<prefix>_A_<queue>), which has no hold consumer: its ack releases it by deletion, that
// ticket alone, and the new ledger does not count it.
func TestReleaseOfOldLedgerTicketDeletes(t *testing.T) {
	ns := testenv.NATS(t)
	b := setupURL(t, ns.URL, queue.Options{}, queue.Spec{Name: "q", MaxDepth: 1})
	old := b.prefix + "_A_q"
	st, err := b.js.CreateStream(b.ctx, jetstream.StreamConfig{Name: old, Subjects: []string{b.prefix + ".a.q.*"},
		Discard: jetstream.DiscardNew, MaxMsgs: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := b.js.Publish(b.ctx, b.prefix+".a.q.t", []byte("old-job")); err != nil {
			t.Fatal(err)
		}
	}
	b.publish(&queue.Job{Queue: "q", Direct: true}) // max_depth 1: the old tickets do not count
	queue.ReleaseAcked(b.q, old+":1")
	if _, err := st.GetMsg(b.ctx, 1); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("old ticket 1 after its release: %v, want deleted", err)
	}
	if _, err := st.GetMsg(b.ctx, 2); err != nil {
		t.Errorf("old ticket 2, not released: %v", err)
	}
	if n := b.q.ReleaseFallbacks(); n != 0 {
		t.Errorf("%d releases counted as fallbacks; want 0 (an old ticket is deleted by design)", n)
	}
}

// In a three-node cluster, where nats-server answers an acknowledgement once it is replicated,
// a drain's releases are answered too: the tickets leave, none by the fallback.
func TestReleaseByAckInACluster(t *testing.T) {
	ns := testenv.NATSCluster(t)
	spec := queue.Spec{Name: "q", Replicas: 3, MaxDepth: 100}
	b := setupURL(t, ns.URL, queue.Options{Replicas: 3}, spec)
	const jobs = 20
	for range jobs {
		b.publish(&queue.Job{Queue: "q", Direct: true})
	}
	ledger, err := b.js.Stream(b.ctx, b.prefix+"_L_q")
	if err != nil {
		t.Fatal(err)
	}
	held := func() uint64 {
		info, err := ledger.Info(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	if n := held(); n != jobs {
		t.Fatalf("the ledger holds %d tickets, want %d", n, jobs)
	}
	b.drain("q")
	deadline := time.Now().Add(10 * time.Second)
	for held() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the ledger still holds %d tickets after the drain", held())
		}
		time.Sleep(20 * time.Millisecond) // polling the condition
	}
	if n := b.q.ReleaseFallbacks(); n != 0 {
		t.Errorf("%d releases fell back to deletion; want 0", n)
	}
}

// holdState reads ledger's hold consumer: tickets delivered (pending its acknowledgement) and
// not delivered yet.
func holdState(t *testing.T, b *bundle, ledger string) (delivered, undelivered uint64) {
	t.Helper()
	hold, err := b.js.PushConsumer(b.ctx, ledger, "hold")
	if err != nil {
		t.Fatalf("hold consumer of %s: %v", ledger, err)
	}
	info, err := hold.Info(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(info.NumAckPending), info.NumPending
}

// waitHold waits until ledger's hold consumer has delivered (pending their acknowledgement)
// and not delivered the given numbers of tickets; it fails the test with what it read last
// after 10 s.
func waitHold(t *testing.T, b *bundle, ledger string, delivered, undelivered uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, u := holdState(t, b, ledger)
		if d == delivered && u == undelivered {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("hold consumer of %s: %d tickets delivered, %d undelivered; want %d and %d", ledger, d, u, delivered, undelivered)
		}
		time.Sleep(5 * time.Millisecond) // polling the condition
	}
}

// A process that only publishes (an ingress without workers) does not receive the holds'
// deliveries, so while no worker runs the server delivers no ticket (intake pays no delivery,
// the hold's state stays empty); the first consumer a process opens subscribes, the tickets
// stored meanwhile are delivered, and a drain releases every one by acknowledgement. The
// bounds hold throughout: the undelivered tickets count.
func TestHoldDeliversOnlyOnceAConsumerIsOpen(t *testing.T) {
	ns := testenv.NATS(t)
	spec := queue.Spec{Name: "q", MaxDepth: 60}
	ingress := setupURL(t, ns.URL, queue.Options{}, spec)
	if queue.HoldSubscribed(ingress.q) {
		t.Fatal("a Queues that opened no consumer receives the holds' deliveries")
	}
	const jobs = 60
	for range jobs {
		ingress.publish(&queue.Job{Queue: "q", Direct: true, Body: []byte("x")})
	}
	_, err := ingress.q.Publish(ingress.ctx, &queue.Job{Queue: "q", Direct: true})
	wantErr(t, err, queue.ErrFull)
	ledger := ingress.prefix + "_L_q"
	waitHold(t, ingress, ledger, 0, jobs) // with no consumer open anywhere

	// A worker: another Queues over another connection, same prefix.
	worker := setupURL(t, ns.URL, queue.Options{Prefix: ingress.prefix}, spec)
	c := worker.consumer("q")
	if !queue.HoldSubscribed(worker.q) || queue.HoldSubscribed(ingress.q) {
		t.Fatalf("after the worker opened a consumer: worker subscribed %v, ingress %v; want true, false",
			queue.HoldSubscribed(worker.q), queue.HoldSubscribed(ingress.q))
	}
	waitHold(t, worker, ledger, jobs, 0) // delivered once the worker subscribed
	for got := 0; got < jobs; {
		msgs, err := c.Fetch(worker.ctx, 20, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if err := m.Ack(worker.ctx); err != nil {
				t.Fatal(err)
			}
		}
		got += len(msgs)
	}
	waitTickets(t, ns, ledger, 0)
	if n := worker.q.ReleaseFallbacks(); n != 0 {
		t.Errorf("%d releases fell back to deletion; want 0", n)
	}
}

// Releases wait for their answers on one subscription, not each in a goroutine of its own: 100
// jobs acked whose tickets the hold consumer never delivered (so no answer comes) leave their
// 100 releases published and waiting, with no goroutine per release (a request per release,
// each waited for by its goroutine, kept 100 until holdWait), and each, published once more at
// holdWait, falls back to deletion at twice holdWait: every ticket leaves.
func TestReleasesWaitWithoutAGoroutineEach(t *testing.T) {
	ns := testenv.NATS(t)
	b := setupURL(t, ns.URL, queue.Options{}, queue.Spec{Name: "q", MaxDepth: 1000})
	queue.DropHold(b.q, time.Second)
	const jobs = 100
	for range jobs {
		b.publish(&queue.Job{Queue: "q", Direct: true, Body: []byte("x")})
	}
	ledger := b.prefix + "_L_q"
	waitTickets(t, ns, ledger, jobs)
	c := b.consumer("q")
	var msgs []*queue.Msg
	for len(msgs) < jobs {
		got, err := c.Fetch(b.ctx, jobs-len(msgs), 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, got...)
	}
	before := runtime.NumGoroutine()
	start := time.Now()
	for _, m := range msgs {
		if err := m.AckNoWait(); err != nil {
			t.Fatal(err)
		}
	}
	for queue.ReleasesPublished(b.q) < jobs {
		if time.Since(start) > 900*time.Millisecond { // before holdWait: no second try yet
			t.Fatalf("%d of %d releases published", queue.ReleasesPublished(b.q), jobs)
		}
		time.Sleep(time.Millisecond) // polling the condition, in process
	}
	grew := runtime.NumGoroutine() - before // no fallback before twice holdWait
	t.Logf("%d releases published and waiting: %d more goroutines", jobs, grew)
	if grew > jobs/10 {
		t.Errorf("%d releases waiting for their answers kept %d more goroutines; want none per release", jobs, grew)
	}
	waitTickets(t, ns, ledger, 0)
	if n := queue.ReleasesPublished(b.q); n != 2*jobs {
		t.Errorf("%d releases published; want %d, each tried twice", n, 2*jobs)
	}
	if n := b.q.ReleaseFallbacks(); n != jobs {
		t.Errorf("%d releases fell back to deletion; want %d", n, jobs)
	}
}
