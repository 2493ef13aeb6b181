package queue_test

import (
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// Provisioning what already exists as wanted sends JetStream no update: every process
// provisions at start and on each reload, and the server's updates of a store raced its
// consumer creations from other processes. A changed setting is still applied.
func TestProvisionAgainSendsNoUpdates(t *testing.T) {
	specs := []queue.Spec{{Name: "plain", MaxBytes: 1 << 20}, {Name: "fair", Fair: true}}
	b := setup(t, queue.Options{}, specs...)
	watch := testenv.Connect(t, b.url)
	var updates atomic.Int64
	for _, subj := range []string{"$JS.API.STREAM.UPDATE.>", "$JS.API.CONSUMER.CREATE.>", "$JS.API.CONSUMER.DURABLE.CREATE.>"} {
		if _, err := watch.Subscribe(subj, func(m *nats.Msg) { updates.Add(1); t.Logf("update %s", m.Subject) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := b.q.Provision(b.ctx, specs); err != nil {
		t.Fatal(err)
	}
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := updates.Load(); n != 0 {
		t.Errorf("provisioning unchanged queues again sent %d updates, want 0", n)
	}

	specs[0].MaxDepth = 7
	if err := b.q.Provision(b.ctx, specs); err != nil {
		t.Fatal(err)
	}
	info, err := b.js.Stream(b.ctx, b.stream("plain"))
	if err != nil {
		t.Fatal(err)
	}
	if got := info.CachedInfo().Config.MaxMsgs; got != 7 {
		t.Errorf("MaxMsgs after a changed max depth = %d, want 7", got)
	}
}
