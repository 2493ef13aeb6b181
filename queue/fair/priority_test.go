package fair_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/queue"
	"github.com/sluice-rl/sluice/queue/fair"
)

// publishLevel publishes n jobs of tenant with priority p to queue name, and returns their ids.
func (b *bundle) publishLevel(name, tenant string, p queue.Priority, n int) []string {
	b.t.Helper()
	ids := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := b.q.Publish(b.ctx, &queue.Job{Queue: name, Tenant: tenant, Priority: p, Method: "POST", Path: "/x",
				Body: fmt.Appendf(nil, "%s-%s-%d", tenant, p, i)})
			if err != nil {
				errs <- err
				return
			}
			ids[i] = r.ID
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.t.Fatal(err)
	}
	return ids
}

// delivered is one job taken from the delivery stream.
type delivered struct {
	tenant string
	p      queue.Priority
}

// drainLevels is drainFair with each job's priority.
func (b *bundle) drainLevels(name string, opts fair.Options, want int) []delivered {
	b.t.Helper()
	defer b.schedule(name, opts)()
	cons, err := b.q.Consumer(b.ctx, name)
	if err != nil {
		b.t.Fatal(err)
	}
	var order []delivered
	deadline := time.Now().Add(time.Minute)
	for len(order) < want && time.Now().Before(deadline) {
		msgs, err := cons.Fetch(b.ctx, 1, 200*time.Millisecond)
		if err != nil {
			b.t.Fatal(err)
		}
		for _, m := range msgs {
			order = append(order, delivered{m.Job.Tenant, m.Job.Priority})
			if err := m.Ack(b.ctx); err != nil {
				b.t.Fatal(err)
			}
		}
	}
	return order
}

// A fair queue orders each tenant's jobs by priority within its share, needing no
// priorities: true: tenant a's high jobs go before its normal before its low, but for the
// starvation guard, while tenant b keeps its half. Depths, Tenant, Backlog, Place and Cancel
// see all of a tenant's levels.
func TestFairPriorities(t *testing.T) {
	b := setup(t, queue.Spec{Name: "p", Fair: true})
	b.publishLevel("p", "a", queue.PriorityLow, 30)
	b.publishLevel("p", "a", queue.PriorityNormal, 5)
	high := b.publishLevel("p", "a", queue.PriorityHigh, 10)
	b.publishLevel("p", "b", queue.PriorityNormal, 30)
	b.checkLevelsSeen(high)

	order := b.drainLevels("p", fair.Options{Target: 1}, 74)
	if len(order) != 74 {
		t.Fatalf("delivered %d jobs, want 74", len(order))
	}
	var a strings.Builder // a's levels in delivery order, a letter each
	bFirst := 0           // b's deliveries among the first 40, while both have jobs
	for i, d := range order {
		switch {
		case d.tenant == "a":
			a.WriteString(letter(d.p))
		case i < 40:
			bFirst++
		}
	}
	t.Logf("a's jobs in delivery order: %s; b got %d of the first 40", a.String(), bFirst)
	// 9 high (one canceled): 7, then the guard gives low and normal a turn each (low, the
	// lowest due, first), then the 2 other high, then normal before low.
	if want := "hhhhhhhlnhhnnnn"; !strings.HasPrefix(a.String(), want) || strings.Count(a.String(), "l") != 30 {
		t.Errorf("a's jobs went %s, want %s then its 29 other low ones", a.String(), want)
	}
	if bFirst < 18 || bFirst > 22 {
		t.Errorf("b got %d of the first 40 deliveries, want 20 ±2", bFirst)
	}
}

// checkLevelsSeen checks, on queue p as TestFairPriorities fills it, that Info, Backlog and
// Tenant count all of tenant a's levels, that Place finds a high job among a's high ones, and
// that Cancel takes one (high[0]) out of the backlog.
func (b *bundle) checkLevelsSeen(high []string) {
	t := b.t
	info, err := b.q.Info(b.ctx, "p")
	if err != nil || info.Backlog != 75 || info.Tenants != 2 || info.TopTenants[0] != (queue.TenantDepth{Tenant: "a", Depth: 45}) {
		t.Fatalf("info = %+v, %v; want backlog 75, 2 tenants, a (45) first", info, err)
	}
	bl, err := b.q.Backlog(b.ctx, "p")
	if err != nil || bl.Tenants["a"] != 45 || bl.Waiting != 75 {
		t.Fatalf("backlog = %+v, %v; want a 45 of 75", bl, err)
	}
	st, err := b.q.Status(b.ctx, high[3])
	if err != nil {
		t.Fatal(err)
	}
	pl, err := b.q.Place(b.ctx, st)
	if err != nil || pl.TenantFirst > pl.BacklogSeq || pl.BacklogSeq > pl.TenantLast || pl.TenantLast-pl.TenantFirst < 9 {
		t.Fatalf("place of a high job = %+v, %v; want within its tenant's 10 high jobs", pl, err)
	}
	if _, err := b.q.Cancel(b.ctx, high[0]); err != nil {
		t.Fatal(err)
	}
	if ti, err := b.q.Tenant(b.ctx, "p", "a"); err != nil || ti.Depth != 44 {
		t.Fatalf("tenant a = %+v, %v; want depth 44 after a cancel", ti, err)
	}
}

// letter is h, n or l for priority p.
func letter(p queue.Priority) string {
	if p == queue.PriorityNormal {
		return "n"
	}
	return string(p)[:1]
}

// A backlog stream provisioned before priorities, with the tenants' subjects only, gets the
// level subjects when provisioned again; a normal job stored before keeps its subject and is
// delivered, after a high job of its tenant stored since.
func TestFairBacklogUpgrade(t *testing.T) {
	spec := queue.Spec{Name: "u", Fair: true}
	b := setup(t, spec)
	l, err := b.q.FairLayout("u")
	if err != nil {
		t.Fatal(err)
	}
	st, err := b.js.Stream(b.ctx, l.Backlog)
	if err != nil {
		t.Fatal(err)
	}
	old := st.CachedInfo().Config
	cur := slices.Clone(old.Subjects)
	old.Subjects = old.Subjects[:1] // as provisioned before: <prefix>.t.u.*
	if _, err := b.js.UpdateStream(b.ctx, old); err != nil {
		t.Fatal(err)
	}
	b.publishLevel("u", "a", queue.PriorityNormal, 1)
	if _, err := b.q.Publish(b.ctx, &queue.Job{Queue: "u", Tenant: "a", Priority: queue.PriorityHigh, Method: "POST", Path: "/x"}); err == nil {
		t.Fatal("a high job stored in a backlog stream without level subjects")
	}
	if err := b.q.Provision(b.ctx, []queue.Spec{spec}); err != nil {
		t.Fatal(err)
	}
	got, err := b.js.Stream(b.ctx, l.Backlog)
	if err != nil {
		t.Fatal(err)
	}
	if subj := got.CachedInfo().Config.Subjects; !slices.Equal(subj, cur) {
		t.Fatalf("backlog subjects after provisioning again = %v, want %v", subj, cur)
	}
	if err := b.q.Provision(b.ctx, []queue.Spec{spec}); err != nil { // idempotent
		t.Fatal(err)
	}
	b.publishLevel("u", "a", queue.PriorityHigh, 1)
	order := b.drainLevels("u", fair.Options{Target: 1}, 2)
	want := []delivered{{"a", queue.PriorityHigh}, {"a", queue.PriorityNormal}}
	if !slices.Equal(order, want) {
		t.Errorf("delivered %v, want %v", order, want)
	}
}
