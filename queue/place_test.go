package queue_test

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// TestBacklogAndPlaceFIFO: a plain queue's reading counts its waiting jobs and moves its ack
// floor as jobs leave; a waiting job's place is its sequence, from the receipt, its status and
// a lookup alike.
func TestBacklogAndPlaceFIFO(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q"})
	var rs []queue.Receipt
	for range 5 {
		rs = append(rs, b.publish(&queue.Job{Queue: "q", Direct: true}))
	}
	for i, r := range rs {
		if r.Seq != uint64(i+1) {
			t.Fatalf("receipt %d: seq %d, want %d", i, r.Seq, i+1)
		}
	}
	var bl queue.Backlog
	testenv.WaitFor(t, 5*time.Second, "the consumer counts 5 pending", func() bool {
		var err error
		bl, err = b.q.Backlog(b.ctx, "q")
		return err == nil && bl.Pending == 5
	})
	if bl.AckFloor != 0 || bl.InFlight != 0 || bl.Tenants != nil {
		t.Fatalf("backlog of 5 new jobs = %+v", bl)
	}
	st, err := b.q.Status(b.ctx, rs[2].ID)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := b.q.Place(b.ctx, st); err != nil || p.Seq != 3 {
		t.Fatalf("place of the third job from its status = %+v, %v; want seq 3", p, err)
	}
	st.Seq = 0 // as a job with a status entry has it
	if p, err := b.q.Place(b.ctx, st); err != nil || p.Seq != 3 {
		t.Fatalf("place of the third job looked up = %+v, %v; want seq 3", p, err)
	}
	c := b.consumer("q")
	for range 2 {
		if err := b.fetchOne(c, 5*time.Second).Ack(b.ctx); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 5*time.Second, "the ack floor at 2", func() bool {
		bl, err = b.q.Backlog(b.ctx, "q")
		return err == nil && bl.AckFloor == 2 && bl.Pending == 3
	})
	if _, err := b.q.Backlog(b.ctx, "nope"); err == nil {
		t.Fatal("the backlog of an unknown queue was read")
	}
}

// TestBacklogAndPlaceFair: a fair queue's reading counts each tenant's backlog; a job there is
// placed between its tenant's oldest and newest waiting jobs.
func TestBacklogAndPlaceFair(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "f", Fair: true})
	var a []queue.Receipt
	for i := range 5 {
		tenant := "B"
		if i%2 == 0 {
			tenant = "A"
		}
		r := b.publish(&queue.Job{Queue: "f", Direct: true, Tenant: tenant})
		if tenant == "A" {
			a = append(a, r)
		}
	}
	bl, err := b.q.Backlog(b.ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	if bl.Waiting != 5 || len(bl.Tenants) != 2 || bl.Tenants["A"] != 3 || bl.Tenants["B"] != 2 {
		t.Fatalf("fair backlog = %+v, want A 3, B 2", bl)
	}
	st, err := b.q.Status(b.ctx, a[1].ID)
	if err != nil {
		t.Fatal(err)
	}
	p, err := b.q.Place(b.ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	want := queue.Place{BacklogSeq: a[1].Seq, TenantFirst: a[0].Seq, TenantLast: a[2].Seq}
	if p != want {
		t.Fatalf("place of A's second job = %+v, want %+v", p, want)
	}
}

// TestControlOfOneQueue: Control reads what SetControl wrote, and nothing for another queue.
func TestControlOfOneQueue(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q"}, queue.Spec{Name: "r"})
	until := time.Now().Add(time.Minute).UTC().Truncate(time.Second)
	if _, err := b.q.SetControl(b.ctx, "q", func(c *queue.Control) { c.Paused, c.PausedUntil, c.Rate = true, until, "4/s" }); err != nil {
		t.Fatal(err)
	}
	c, err := b.q.Control(b.ctx, "q")
	if err != nil || !c.Paused || !c.PausedUntil.Equal(until) || c.Rate != "4/s" {
		t.Fatalf("control of q = %+v, %v", c, err)
	}
	if c, err := b.q.Control(b.ctx, "r"); err != nil || c.Paused || !c.PausedUntil.IsZero() || c.Rate != "" {
		t.Fatalf("control of r = %+v, %v; want none", c, err)
	}
}
