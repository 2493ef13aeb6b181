package queue_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
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

// TestDomainPermissions: CheckPermissions through a context made with a domain probes that
// domain's API subjects, which a client of a leaf node in a domain of its own uses to reach
// the hub's JetStream, and its error names the fix for them. Users of the leaf, their
// permissions written into its config file as an operator would: one granted PermissionsFix
// ("$JS.API.>", the leaf's own JetStream) is refused "$JS.hub.API.INFO"; one granted
// PermissionsFor the domain passes, and with no more than that provisions a queue, publishes,
// fetches, records a status and acks through the domain.
func TestDomainPermissions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	hubNC := testenv.Connect(t, testenv.NATS(t).URL) // a context to compute the fix with, no I/O
	hubCtx, err := jetstream.NewWithDomain(hubNC, "hub")
	if err != nil {
		t.Fatal(err)
	}
	fix := queue.PermissionsFor(hubCtx)
	if plain, err := jetstream.New(hubNC); err != nil || queue.PermissionsFor(plain) != queue.PermissionsFix {
		t.Fatalf("PermissionsFor a context on $JS.API.: %v, %v; want PermissionsFix", queue.PermissionsFor(plain), err)
	}
	if !strings.Contains(fix, `"$JS.hub.API.>"`) || strings.Contains(fix, `"$JS.API.>"`) {
		t.Fatalf("PermissionsFor a context in domain hub: %s; want $JS.hub.API.> instead of $JS.API.>", fix)
	}
	conf := filepath.Join(t.TempDir(), "leaf.conf")
	users := `authorization { users = [
  { user: admin, password: admin }
  { user: plain, password: p, ` + queue.PermissionsFix + ` }
  { user: domain, password: p, ` + fix + ` }
] }
no_auth_user: admin
`
	if err := os.WriteFile(conf, []byte(users), 0o644); err != nil {
		t.Fatal(err)
	}
	_, leaf := testenv.NATSDomains(t, "hub", "leaf", func(o *server.Options) {
		if err := o.ProcessConfigFile(conf); err != nil {
			t.Fatalf("the leaf's users: %v", err)
		}
	})
	as := func(user string) jetstream.JetStream {
		nc := testenv.Connect(t, strings.Replace(leaf.URL, "nats://", "nats://"+user+":p@", 1))
		js, err := jetstream.NewWithDomain(nc, "hub")
		if err != nil {
			t.Fatal(err)
		}
		return js
	}

	err = queue.CheckPermissions(ctx, as("plain"), []string{"q"})
	if !errors.Is(err, queue.ErrPermission) || !strings.Contains(err.Error(), `refused Publish to "$JS.hub.API.INFO"`) ||
		!strings.Contains(err.Error(), fix) {
		t.Fatalf("CheckPermissions as a user granted $JS.API.> through domain hub: %v; want ErrPermission naming "+
			"$JS.hub.API.INFO and the fix %s", err, fix)
	}
	t.Logf("as plain: %v", err)

	js := as("domain")
	if err := queue.CheckPermissions(ctx, js, []string{"q"}); err != nil {
		t.Fatalf("CheckPermissions as a user granted PermissionsFor the domain: %v", err)
	}
	q, err := queue.New(ctx, js, queue.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		q.Close(ctx)
	})
	if err := q.Provision(ctx, []queue.Spec{{Name: "q", MaxDepth: 10}}); err != nil {
		t.Fatal(err)
	}
	b := &bundle{t: t, ctx: ctx, url: leaf.URL, js: js, q: q, prefix: queue.DefaultPrefix}
	id := b.publish(&queue.Job{Queue: "q", Method: http.MethodPost, Path: "/x"}).ID
	m := b.fetchOne(b.consumer("q"), 5*time.Second)
	if err := q.SetStatus(ctx, queue.Status{ID: id, State: queue.StateSucceeded, Attempts: 1, Delivered: 1}); err != nil {
		t.Fatal(err)
	}
	if err := m.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := q.Record(ctx, id); err != nil || st.State != queue.StateSucceeded {
		t.Fatalf("Record: %+v, %v; want succeeded", st, err)
	}
}
