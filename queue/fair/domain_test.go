package fair_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
	"github.com/sluice-rl/sluice/queue/fair"
)

// TestFairDomainDirectGets: a fair queue's scheduler over a JetStream context made with a
// domain (a client of a leaf node in a domain of its own, the streams in the hub's domain)
// reads its tenants' backlogs by batched direct gets (a tenant's share of a round; the single
// jobs of many tenants in one multi_last request) on that domain's API subjects, those of
// queue.APIPrefix: on "$JS.API." the leaf's JetStream, which has none of the streams, answers
// no one, and no job would be moved (the test times out). Every job is delivered.
func TestFairDomainDirectGets(t *testing.T) {
	_, leaf := testenv.NATSDomains(t, "hub", "leaf")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	js, err := jetstream.NewWithDomain(testenv.Connect(t, leaf.URL), "hub")
	if err != nil {
		t.Fatal(err)
	}
	q, err := queue.New(ctx, js, queue.Options{Prefix: testenv.Name(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		q.Close(ctx)
	})
	if err := q.Provision(ctx, []queue.Spec{{Name: "f", Fair: true}}); err != nil {
		t.Fatal(err)
	}
	b := &bundle{t: t, ctx: ctx, js: js, q: q}
	// a's jobs are read in batches; b's and c's, single, by one multi_last request.
	want := map[string][]string{"a": b.publishTenant("f", "a", 6), "b": b.publishTenant("f", "b", 1),
		"c": b.publishTenant("f", "c", 1)}
	defer b.schedule("f", fair.Options{Target: 2})()
	cons, err := q.Consumer(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	n := 0
	testenv.WaitFor(t, 20*time.Second, "the fair queue's 8 jobs delivered", func() bool {
		msgs, err := cons.Fetch(ctx, 8, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			got[m.Job.Tenant] = append(got[m.Job.Tenant], m.Job.ID)
			n++
			if err := m.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return n >= 8
	})
	for tenant, ids := range want {
		if len(got[tenant]) != len(ids) {
			t.Errorf("tenant %s: %d of %d jobs delivered", tenant, len(got[tenant]), len(ids))
		}
	}
}
