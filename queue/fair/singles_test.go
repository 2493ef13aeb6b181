package fair

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// TestFairSingles moves the one job each of many tenants together (moveSingles), while every
// tenant's second job arrives after the reading that counted one: each tenant's first job
// must go first, each job exactly once, and a reading with no new job must not list the
// subjects again while one with a new tenant must (refresh).
func TestFairSingles(t *testing.T) {
	const tenants = 300
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(testenv.Connect(t, testenv.NATS(t).URL))
	if err != nil {
		t.Fatal(err)
	}
	qs, err := queue.New(ctx, js, queue.Options{Prefix: testenv.Name(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer qs.Close(context.Background())
	if err := qs.Provision(ctx, []queue.Spec{{Name: "s", Fair: true}}); err != nil {
		t.Fatal(err)
	}
	publish := func(tenant, body string) {
		t.Helper()
		if _, err := qs.Publish(ctx, &queue.Job{Queue: "s", Tenant: tenant, Method: "POST", Path: "/x", Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range tenants {
		publish(fmt.Sprintf("t%03d", i), fmt.Sprintf("t%03d/first", i))
	}
	s, err := New(qs, "s", Options{Target: 10 * tenants})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.open(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.refresh(ctx, s.Options()); err != nil {
		t.Fatal(err)
	}
	listed := s.fullRead
	for i := range tenants {
		publish(fmt.Sprintf("t%03d", i), fmt.Sprintf("t%03d/second", i))
	}
	// The round rereads nothing (refreshed just now): each tenant was counted at one job.
	n, err := s.round(ctx)
	if err != nil || n != tenants {
		t.Fatalf("first round moved %d (%v), want %d", n, err, tenants)
	}
	s.refreshed = time.Time{}
	if n, err = s.round(ctx); err != nil || n != tenants {
		t.Fatalf("second round moved %d (%v), want %d", n, err, tenants)
	}
	if !s.fullRead.After(listed) {
		t.Errorf("the second round did not list the subjects, though %d jobs arrived", tenants)
	}
	got := map[string][]string{}
	del, err := js.Stream(ctx, s.l.Delivery)
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 2*tenants+1; seq++ {
		raw, err := del.GetMsg(ctx, seq)
		if seq == 2*tenants+1 {
			if err == nil {
				t.Errorf("more than %d jobs moved", 2*tenants)
			}
			break
		}
		if err != nil {
			t.Fatalf("delivery stream sequence %d: %v", seq, err)
		}
		tenant, which, _ := strings.Cut(string(raw.Data), "/") // the job's body
		got[tenant] = append(got[tenant], which)
	}
	for i := range tenants {
		id := fmt.Sprintf("t%03d", i)
		if g := got[id]; len(g) != 2 || g[0] != "first" || g[1] != "second" {
			t.Fatalf("tenant %s's jobs moved as %q, want [first second]", id, g)
		}
	}
	// Nothing new: the next reading asks only for the last sequence.
	s.refreshed, listed = time.Time{}, s.fullRead
	if n, err = s.round(ctx); err != nil || n != 0 {
		t.Fatalf("third round moved %d (%v), want 0", n, err)
	}
	if !s.fullRead.Equal(listed) {
		t.Error("a round with no job arrived listed the subjects again")
	}
	publish("late", "late")
	s.refreshed = time.Time{}
	if n, err = s.round(ctx); err != nil || n != 1 {
		t.Fatalf("a round after a new tenant's job moved %d (%v), want 1", n, err)
	}
}
