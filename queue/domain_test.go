package queue_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// TestDomainDirectGets: a Queues over a JetStream context made with a domain (a client of a
// leaf node in a domain of its own, the streams in the hub's domain) reads what it reads by
// batched direct gets (a ledger's tickets for the sweep, a batch's status records) on that
// domain's API subjects: on "$JS.API." the leaf's JetStream, which has none of the streams,
// answers no one. Its other paths (admission, release by the hold consumer's
// acknowledgement, counting a shared queue by its tickets, browsing waiting jobs and dead
// letters) work there too.
func TestDomainDirectGets(t *testing.T) {
	hub, leaf := testenv.NATSDomains(t, "hub", "leaf")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	nc := testenv.Connect(t, leaf.URL)
	js, err := jetstream.NewWithDomain(nc, "hub")
	if err != nil {
		t.Fatal(err)
	}
	opts := queue.Options{Prefix: testenv.Name(t), SharedStreams: 2}
	q, err := queue.New(ctx, js, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		q.Close(ctx)
	})
	// "own" keeps a stream of its own (a MaxBytes), "shared" is in a shared stream.
	specs := []queue.Spec{{Name: "own", MaxDepth: 10, MaxBytes: 1 << 20}, {Name: "shared", MaxDepth: 10}}
	if err := q.Provision(ctx, specs); err != nil {
		t.Fatal(err)
	}
	b := &bundle{t: t, ctx: ctx, url: leaf.URL, nc: nc, js: js, q: q, prefix: opts.Prefix, opts: opts}
	// The streams are the hub's, not the leaf's.
	hubJS, err := jetstream.New(testenv.Connect(t, hub.URL))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hubJS.Stream(ctx, b.stream("own")); err != nil {
		t.Fatalf("the hub's stream %s: %v", b.stream("own"), err)
	}

	job := func(name string) *queue.Job {
		return &queue.Job{Queue: name, Method: http.MethodPost, Path: "/x", Body: []byte("x")}
	}
	var ids, own []string
	for range 3 {
		own = append(own, b.publish(job("own")).ID)
		ids = append(ids, own[len(own)-1], b.publish(job("shared")).ID)
	}

	// Records: one batched direct get of the status bucket.
	for _, id := range ids {
		if err := q.SetStatus(ctx, queue.Status{ID: id, State: queue.StateRetrying, Attempts: 1}); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := q.Records(ctx, ids)
	if err != nil || len(recs) != len(ids) {
		t.Fatalf("Records: %d of %d, %v; want every one", len(recs), len(ids), err)
	}

	// The shared queue, without a consumer, counted by its tickets; both browsed.
	counts, err := q.Counts(ctx, false)
	if err != nil || counts["shared"].Depth != 3 || counts["own"].Depth != 3 {
		t.Fatalf("Counts: %+v, %v; want own and shared at 3", counts, err)
	}
	for _, name := range []string{"own", "shared"} {
		page, err := q.Browse(ctx, name, queue.BrowseQuery{Source: queue.SourceWaiting})
		if err != nil || len(page.Jobs) != 3 {
			t.Fatalf("Browse %s: %d jobs, %v; want 3", name, len(page.Jobs), err)
		}
	}

	// A job acknowledged releases its ticket by the hold consumer's acknowledgement; one
	// dead-lettered is browsed; one acknowledged behind the queue layer's back leaves its
	// ticket, which the sweep reads and removes.
	c := b.consumer("own")
	if err := b.fetchOne(c, 5*time.Second).Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := q.DeadLetter(ctx, b.fetchOne(c, 5*time.Second), "gone", http.StatusGone, 1); err != nil {
		t.Fatal(err)
	}
	ledger := b.prefix + "_L_own"
	tickets := func() uint64 {
		st, err := hubJS.Stream(ctx, ledger)
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo().State.Msgs
	}
	testenv.WaitFor(t, 10*time.Second, "the released tickets gone", func() bool { return tickets() == 1 })
	if n := q.ReleaseFallbacks(); n != 0 {
		t.Errorf("%d releases fell back to deletion; want 0 (the hold consumer's acknowledgements answered)", n)
	}
	dead, err := q.Browse(ctx, "own", queue.BrowseQuery{Source: queue.SourceDead})
	if err != nil || len(dead.Jobs) != 1 {
		t.Fatalf("Browse dead letters: %d, %v; want 1", len(dead.Jobs), err)
	}
	raw, err := js.Consumer(ctx, b.stream("own"), "workers")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := raw.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range own {
		if err := q.SetStatus(ctx, queue.Status{ID: id, State: queue.StateSucceeded, Attempts: 1}); err != nil {
			t.Fatal(err)
		}
	}
	removed, _, err := q.SweepLedger(ctx, "own", 0, 0, 100)
	if err != nil || removed != 1 || tickets() != 0 {
		t.Fatalf("SweepLedger: removed %d, %v, %d tickets left; want the leaked one removed", removed, err, tickets())
	}
}

// The API prefix of the requests the queue layer builds itself follows the context's: its
// domain's, the prefix it was given (with or without its final '.'), else JetStream's own.
func TestAPIPrefixFollowsTheContext(t *testing.T) {
	nc := testenv.Connect(t, testenv.NATS(t).URL)
	for _, c := range []struct {
		make func() (jetstream.JetStream, error)
		want string
	}{
		{func() (jetstream.JetStream, error) { return jetstream.New(nc) }, "$JS.API."},
		{func() (jetstream.JetStream, error) { return jetstream.NewWithDomain(nc, "hub") }, "$JS.hub.API."},
		{func() (jetstream.JetStream, error) { return jetstream.NewWithAPIPrefix(nc, "JS.acc.API") }, "JS.acc.API."},
		{func() (jetstream.JetStream, error) { return jetstream.NewWithAPIPrefix(nc, "JS.acc.API.") }, "JS.acc.API."},
	} {
		js, err := c.make()
		if err != nil {
			t.Fatal(err)
		}
		if got := queue.APIPrefix(js); got != c.want {
			t.Errorf("API prefix %q, want %q", got, c.want)
		}
	}
}
