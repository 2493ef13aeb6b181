package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// TestTenantControlsOneKeyEach: a tenant's settings are one key of their own (issue 41, item
// 7). An older version's map in the queue's entry is read, then moved to per-tenant keys by
// the first write; a PATCH of one tenant writes one small entry; a deleted tenant stays
// deleted; the cap holds; and 10 000 tenants fit where the single value failed at 8 594.
func TestTenantControlsOneKeyEach(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q", Fair: true}, queue.Spec{Name: "other", Fair: true})
	meta, err := b.js.KeyValue(b.ctx, b.prefix+"_META")
	if err != nil {
		t.Fatal(err)
	}
	const a, c = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "cccccccccccccccccccccccccccccccc"
	// An older version's entry: every tenant in the queue's value.
	legacy, _ := json.Marshal(queue.Control{Rate: "9/s", Tenants: map[string]queue.TenantControl{a: {Weight: 2}, c: {Rate: "1/s"}}})
	if _, err := meta.Put(b.ctx, "ctl.q", legacy); err != nil {
		t.Fatal(err)
	}
	cs, err := b.q.Controls(b.ctx)
	if err != nil || cs["q"].Rate != "9/s" || cs["q"].Tenants[a].Weight != 2 || cs["q"].Tenants[c].Rate != "1/s" {
		t.Fatalf("the older entry read: %+v %v", cs, err)
	}
	if tc, ok, err := b.q.TenantControl(b.ctx, "q", a); err != nil || !ok || tc.Weight != 2 {
		t.Fatalf("TenantControl of the older entry: %+v %v %v", tc, ok, err)
	}
	if n, err := b.q.TenantCounts(b.ctx); err != nil || n["q"] != 2 {
		t.Fatalf("TenantCounts of the older entry: %v %v, want q: 2", n, err)
	}

	seen := make(chan queue.Control, 64)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() {
		done <- b.q.WatchControls(ctx, func(m map[string]queue.Control) {
			select {
			case seen <- m["q"]:
			case <-ctx.Done():
			}
		})
	}()
	stopWatch := func() {
		if cancel != nil {
			cancel()
			<-done
			cancel = nil
		}
	}
	t.Cleanup(stopWatch)
	<-seen // the initial values

	// The first tenant write moves the map to per-tenant keys, and deletes one of them.
	if _, err := b.q.SetTenantControl(b.ctx, "q", c, 10, func(tc *queue.TenantControl) { *tc = queue.TenantControl{} }); err != nil {
		t.Fatal(err)
	}
	e, err := meta.Get(b.ctx, "ctl.q")
	var stored queue.Control
	if err != nil || json.Unmarshal(e.Value(), &stored) != nil || stored.Tenants != nil || stored.Rate != "9/s" {
		t.Fatalf("the queue's entry after the move: %s %v, want its rate and no tenants", e.Value(), err)
	}
	cs, _ = b.q.Controls(b.ctx)
	if len(cs["q"].Tenants) != 1 || cs["q"].Tenants[a].Weight != 2 {
		t.Fatalf("after deleting c: %+v, want a alone, as it was", cs["q"].Tenants)
	}
	one, err := b.q.Control(b.ctx, "q")
	if err != nil || len(one.Tenants) != 1 || one.Rate != "9/s" {
		t.Fatalf("Control(q) = %+v %v", one, err)
	}
	if qc, err := b.q.QueueControls(b.ctx); err != nil || qc["q"].Rate != "9/s" || qc["q"].Tenants != nil {
		t.Fatalf("QueueControls = %+v %v, want q's rate and no tenants", qc, err)
	}
	if _, ok, err := b.q.TenantControl(b.ctx, "q", c); err != nil || ok {
		t.Fatalf("TenantControl of the deleted c: %v %v, want none", ok, err)
	}
	var last queue.Control
	testenv.WaitFor(t, 5*time.Second, "the watch to see c deleted", func() bool {
		for len(seen) > 0 {
			last = <-seen
		}
		_, hasC := last.Tenants[c]
		return last.Tenants != nil && !hasC && last.Tenants[a].Weight == 2
	})
	stopWatch()

	// A PATCH of one tenant writes one entry, of a few bytes.
	st, err := b.js.Stream(b.ctx, "KV_"+b.prefix+"_META")
	if err != nil {
		t.Fatal(err)
	}
	before, _ := st.Info(b.ctx)
	if _, err := b.q.SetTenantControl(b.ctx, "q", a, 10, func(tc *queue.TenantControl) { tc.Rate = "3/s" }); err != nil {
		t.Fatal(err)
	}
	after, _ := st.Info(b.ctx)
	if n := after.State.LastSeq - before.State.LastSeq; n != 1 {
		t.Errorf("one tenant's PATCH wrote %d entries, want 1", n)
	}
	if m, err := st.GetLastMsgForSubject(b.ctx, "$KV."+b.prefix+"_META.tctl.q."+a); err != nil || len(m.Data) > 100 {
		t.Errorf("the tenant's entry: %v, %d bytes", err, len(m.Data))
	}

	// The cap: the 11th tenant of a cap of 10 is refused, an existing one still changes.
	for i := range 9 {
		id := fmt.Sprintf("%032x", i+1)
		if _, err := b.q.SetTenantControl(b.ctx, "q", id, 10, func(tc *queue.TenantControl) { tc.InFlight = 2 }); err != nil {
			t.Fatalf("tenant %d of 10: %v", i+2, err)
		}
	}
	if _, err := b.q.SetTenantControl(b.ctx, "q", fmt.Sprintf("%032x", 99), 10, func(tc *queue.TenantControl) { tc.InFlight = 2 }); !errors.Is(err, queue.ErrTooManyTenants) {
		t.Errorf("the 11th tenant of 10: %v, want ErrTooManyTenants", err)
	}
	if _, err := b.q.SetTenantControl(b.ctx, "q", a, 10, func(tc *queue.TenantControl) { tc.Weight = 5 }); err != nil {
		t.Errorf("changing a tenant at the cap: %v", err)
	}
	if _, err := b.q.SetTenantControl(b.ctx, "other", a, 10, func(tc *queue.TenantControl) { tc.Weight = 5 }); err != nil {
		t.Errorf("another queue's tenant: %v, want its own cap", err)
	}

	// 10 000 tenants: the single value failed with "maximum payload exceeded" at 8 594. The
	// first 9 989 are written straight to their keys (fast), the last through SetTenantControl.
	const many = 10_000
	// A publish that finds the window of unacknowledged ones full past its stall wait (200 ms;
	// a loaded machine's server acks slower) fails: wait for the window to drain and publish it
	// again.
	for i := 11; i < many; i++ {
		data, _ := json.Marshal(queue.TenantControl{Rate: "5/s", Weight: 2, InFlight: 3})
		for {
			_, err := b.js.PublishAsync(fmt.Sprintf("$KV.%s_META.tctl.other.%032x", b.prefix, i), data)
			if err == nil {
				break
			}
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				t.Fatal(err)
			}
			select {
			case <-b.js.PublishAsyncComplete():
			case <-time.After(30 * time.Second):
				t.Fatal("the window of unacknowledged publishes did not drain in 30 s")
			}
		}
	}
	select {
	case <-b.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("publishing 10 000 tenants took over 30 s")
	}
	if _, err := b.q.SetTenantControl(b.ctx, "other", fmt.Sprintf("%032x", 1), many, func(tc *queue.TenantControl) { tc.Weight = 4 }); err != nil {
		t.Fatalf("a tenant near 10 000: %v", err)
	}
	cs, err = b.q.Controls(b.ctx)
	if err != nil || len(cs["other"].Tenants) != many-10+1 || len(cs["q"].Tenants) != 10 {
		t.Fatalf("Controls: %v, %d tenants on other, %d on q", err, len(cs["other"].Tenants), len(cs["q"].Tenants))
	}
	for i := 2; i <= 10; i++ {
		if _, err := b.q.SetTenantControl(b.ctx, "other", fmt.Sprintf("%032x", i), many, func(tc *queue.TenantControl) { tc.Weight = 4 }); err != nil {
			t.Fatalf("tenant up to 10 000: %v", err)
		}
	}
	if _, err := b.q.SetTenantControl(b.ctx, "other", fmt.Sprintf("%032x", many+1), many, func(tc *queue.TenantControl) { tc.Weight = 4 }); !errors.Is(err, queue.ErrTooManyTenants) {
		t.Errorf("the 10 001st tenant: %v, want ErrTooManyTenants", err)
	}
	if n, err := b.q.TenantCounts(b.ctx); err != nil || n["other"] != many || n["q"] != 10 {
		t.Errorf("TenantCounts = %v %v, want other: %d, q: 10", n, err, many)
	}
}
