package queue_test

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice/queue"
)

// The roles a Queues hands out work on their own, over its one connection: a job published
// through the Publisher is consumed through the Deliveries, an operator's control set through
// the Operator is read back by the Queues, and the IDs agree with the Queues' own.
func TestRolesShareTheConnection(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "orders"})
	var (
		pub  queue.Publisher  = b.q.Publisher
		dels queue.Deliveries = b.q.Deliveries
		ops  queue.Operator   = b.q.Operator
		ids  queue.IDs        = b.q.IDs
	)
	r, err := pub.Publish(b.ctx, &queue.Job{Queue: "orders", Body: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := pub.Status(b.ctx, r.ID); err != nil || st.State != queue.StateQueued {
		t.Fatalf("Status = %+v, %v; want queued", st, err)
	}
	c, err := dels.Consumer(b.ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := c.Fetch(b.ctx, 1, 5*time.Second)
	if err != nil || len(msgs) != 1 || msgs[0].Job.ID != r.ID {
		t.Fatalf("Fetch = %v, %v; want job %s", msgs, err, r.ID)
	}
	if err := msgs[0].Ack(b.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := ops.SetControl(b.ctx, "orders", func(c *queue.Control) { c.Rate = "5/s" }); err != nil {
		t.Fatal(err)
	}
	if cs, err := b.q.Controls(b.ctx); err != nil || cs["orders"].Rate != "5/s" {
		t.Fatalf("Controls = %v, %v; want orders at 5/s", cs, err)
	}
	if got, want := ids.JobID("orders", "", "k"), b.q.JobID("orders", "", "k"); got != want {
		t.Fatalf("IDs.JobID = %s, Queues.JobID = %s", got, want)
	}
}
