package queue_test

import (
	"testing"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// FormersPossible, by which a fresh worker's runners skip waiting for the first sweep, says
// false only while no shared stream exists: on a server that never had one; not once a
// process provisioned shared streams, nor for a process without them on that server after
// (its queues' jobs may be in the shared streams, former to it).
func TestFormersPossibleOnlyWithSharedStreams(t *testing.T) {
	ns := testenv.NATS(t)
	spec := queue.Spec{Name: "q", MaxDepth: 10}
	own := setupURL(t, ns.URL, queue.Options{}, spec)
	if own.q.FormersPossible() {
		t.Fatal("no shared stream exists, yet former streams are possible")
	}
	shared := setupURL(t, ns.URL, queue.Options{Prefix: own.prefix, SharedStreams: 2}, spec)
	if !shared.q.FormersPossible() {
		t.Error("with shared streams provisioned, former streams are not possible")
	}
	if err := own.q.Provision(own.ctx, []queue.Spec{spec}); err != nil {
		t.Fatal(err)
	}
	if !own.q.FormersPossible() {
		t.Error("a process without shared streams, provisioning after another made them, says no former stream is possible")
	}
}
