package queue_test

import (
	"maps"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// unstampHold makes the hold consumer of stream as an earlier version could have left it:
// other settings where JetStream allows an update (description, AckWait, MaxDeliver,
// MaxAckPending, HeadersOnly), and no stamp in the stream's metadata. It returns the settings
// the hold had.
func unstampHold(b *bundle, stream string) jetstream.ConsumerConfig {
	b.t.Helper()
	st, err := b.js.Stream(b.ctx, stream)
	if err != nil {
		b.t.Fatal(err)
	}
	if cfg := st.CachedInfo().Config; cfg.Metadata["sluice_hold"] != "" {
		cfg.Metadata = maps.Clone(cfg.Metadata)
		delete(cfg.Metadata, "sluice_hold")
		if _, err := b.js.UpdateStream(b.ctx, cfg); err != nil {
			b.t.Fatal(err)
		}
	}
	c, err := b.js.PushConsumer(b.ctx, stream, "hold")
	if err != nil {
		b.t.Fatal(err)
	}
	current := c.CachedInfo().Config
	old := current
	old.Description, old.AckWait, old.MaxDeliver, old.MaxAckPending = "an older hold", time.Minute, 5, 100
	old.HeadersOnly = !current.HeadersOnly
	if _, err := b.js.UpdatePushConsumer(b.ctx, stream, old); err != nil {
		b.t.Fatal(err)
	}
	return current
}

// wantHold fails the test unless stream's hold consumer has want's updatable settings and the
// stream the stamp of them.
func wantHold(b *bundle, stream string, want jetstream.ConsumerConfig) {
	b.t.Helper()
	c, err := b.js.PushConsumer(b.ctx, stream, "hold")
	if err != nil {
		b.t.Fatal(err)
	}
	have := c.CachedInfo().Config
	if have.Description != want.Description || have.AckWait != want.AckWait || have.MaxDeliver != want.MaxDeliver ||
		have.MaxAckPending != want.MaxAckPending || have.HeadersOnly != want.HeadersOnly {
		b.t.Fatalf("hold of %s after Provision: %q ack wait %v, max deliver %d, max ack pending %d, headers only %t; want %q %v %d %d %t",
			stream, have.Description, have.AckWait, have.MaxDeliver, have.MaxAckPending, have.HeadersOnly,
			want.Description, want.AckWait, want.MaxDeliver, want.MaxAckPending, want.HeadersOnly)
	}
	st, err := b.js.Stream(b.ctx, stream)
	if err != nil {
		b.t.Fatal(err)
	}
	if st.CachedInfo().Config.Metadata["sluice_hold"] == "" {
		b.t.Fatalf("stream %s after Provision: metadata %v; want the hold's stamp", stream, st.CachedInfo().Config.Metadata)
	}
}

// A hold consumer made with other settings (by an earlier version) is brought to the current
// ones by the next Provision, on a queue's ledger and on a fair queue's backlog, and the
// jobs held stay held: the ledger still counts its ticket.
func TestProvisionUpdatesHolds(t *testing.T) {
	specs := []queue.Spec{{Name: "q", MaxDepth: 1}, {Name: "f", Fair: true}}
	ns := testenv.NATS(t)
	b := setupURL(t, ns.URL, queue.Options{}, specs...)
	b.publish(&queue.Job{Queue: "q", Direct: true}) // makes the ledger
	ledger, backlog := b.prefix+"_L_q", b.prefix+"_T_f"
	provision := func() uint64 { // the JetStream API requests of a Provision
		t.Helper()
		before, _ := jsState(t, ns, ledger)
		if err := b.q.Provision(b.ctx, specs); err != nil {
			t.Fatal(err)
		}
		after, _ := jsState(t, ns, ledger)
		return after - before
	}
	stamped := provision()
	wantLedger, wantBacklog := unstampHold(b, ledger), unstampHold(b, backlog)
	updating := provision()
	wantHold(b, ledger, wantLedger)
	wantHold(b, backlog, wantBacklog)
	_, err := b.q.Publish(b.ctx, &queue.Job{Queue: "q", Direct: true})
	wantErr(t, err, queue.ErrFull)
	// Stamped again, a Provision looks at no hold.
	again := provision()
	t.Logf("JetStream API requests of a Provision: %d with the holds stamped, %d bringing 2 holds up to date, %d after",
		stamped, updating, again)
	if again != stamped || updating < stamped+6 {
		t.Fatalf("a Provision sent %d requests with the holds stamped, %d when it updated 2 holds, %d after; "+
			"want 3 more per hold (its info, its update, its stream's stamp) when they differ, none when stamped", stamped, updating, again)
	}
}
