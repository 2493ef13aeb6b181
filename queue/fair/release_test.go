package fair

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// releaseSetup provisions fair queue r on an embedded server and publishes one job each of
// singles tenants and deep jobs of tenant "deep", then waits until the backlog's hold has
// delivered them all.
func releaseSetup(t *testing.T, singles, deep int) (context.Context, *testenv.NATSServer, jetstream.JetStream, *queue.Queues) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	ns := testenv.NATS(t)
	js, err := jetstream.New(testenv.Connect(t, ns.URL))
	if err != nil {
		t.Fatal(err)
	}
	qs, err := queue.New(ctx, js, queue.Options{Prefix: testenv.Name(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qs.Close(context.Background()) })
	if err := qs.Provision(ctx, []queue.Spec{{Name: "r", Fair: true}}); err != nil {
		t.Fatal(err)
	}
	for i := range singles {
		publishR(t, ctx, qs, fmt.Sprintf("t%03d", i))
	}
	for range deep {
		publishR(t, ctx, qs, "deep")
	}
	waitHeld(t, ctx, js, qs, singles+deep)
	return ctx, ns, js, qs
}

// publishR publishes a job of tenant to queue r.
func publishR(t *testing.T, ctx context.Context, qs *queue.Queues, tenant string) {
	t.Helper()
	if _, err := qs.Publish(ctx, &queue.Job{Queue: "r", Tenant: tenant, Method: "POST", Path: "/x", Body: []byte(tenant)}); err != nil {
		t.Fatal(err)
	}
}

// waitHeld waits until queue r's backlog hold has delivered every job stored and holds want.
func waitHeld(t *testing.T, ctx context.Context, js jetstream.JetStream, qs *queue.Queues, want int) {
	t.Helper()
	l, err := qs.FairLayout("r")
	if err != nil {
		t.Fatal(err)
	}
	hold, err := js.PushConsumer(ctx, l.Backlog, l.Hold)
	if err != nil {
		t.Fatalf("the backlog has no hold consumer: %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		ci, err := hold.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ci.NumPending == 0 && ci.NumAckPending == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the hold holds %d jobs (%d undelivered), want %d", ci.NumAckPending, ci.NumPending, want)
		}
		time.Sleep(5 * time.Millisecond) // polling the condition
	}
}

// apiTotal is the server's JetStream API request count, read in process (not through the
// API, which would count).
func apiTotal(t *testing.T, ns *testenv.NATSServer) uint64 {
	t.Helper()
	info, err := ns.Server.Jsz(&server.JSzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return info.API.Total
}

// moveAll runs s's rounds until want jobs moved, and returns how many rounds it took.
func moveAll(t *testing.T, ctx context.Context, s *Scheduler, want int) int {
	t.Helper()
	rounds := 0
	for moved := 0; moved < want; rounds++ {
		if rounds > 100 {
			t.Fatalf("%d rounds moved %d of %d jobs", rounds, moved, want)
		}
		n, err := s.round(ctx)
		if err != nil {
			t.Fatal(err)
		}
		moved += n
	}
	return rounds
}

// backlogAndDelivery counts the jobs in the queue's backlog and delivery streams.
func backlogAndDelivery(t *testing.T, ctx context.Context, js jetstream.JetStream, s *Scheduler) (backlog, delivery uint64) {
	t.Helper()
	for i, name := range []string{s.l.Backlog, s.l.Delivery} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		n := st.CachedInfo().State.Msgs
		if i == 0 {
			backlog = n
		} else {
			delivery = n
		}
	}
	return backlog, delivery
}

// A move releases its jobs from the backlog by the hold's acknowledgements: 300 tenants of
// one job each and one of 40 leave the backlog, each job in the delivery stream once, with a
// few JetStream API requests per round and none per job (a DeleteMsg per single job, the
// removal before the hold, would be 300), and no removal fell back to deletion.
func TestFairReleaseByAck(t *testing.T) {
	const singles, deep = 300, 40
	ctx, ns, js, qs := releaseSetup(t, singles, deep)
	s, err := New(qs, "r", Options{Target: 2 * (singles + deep)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.open(ctx); err != nil {
		t.Fatal(err)
	}
	before := apiTotal(t, ns)
	rounds := moveAll(t, ctx, s, singles+deep)
	api := apiTotal(t, ns) - before
	t.Logf("%d jobs moved in %d rounds: %d JetStream API requests, %d removed by deletion", singles+deep, rounds, api, s.deleted.Load())
	if api > uint64(8*rounds) {
		t.Errorf("the moves sent %d JetStream API requests in %d rounds; want a few per round, none per job", api, rounds)
	}
	if n := s.deleted.Load(); n != 0 {
		t.Errorf("%d moved jobs were deleted; want all released by acknowledgement", n)
	}
	if b, d := backlogAndDelivery(t, ctx, js, s); b != 0 || d != singles+deep {
		t.Errorf("backlog holds %d, delivery stream %d; want 0 and %d", b, d, singles+deep)
	}
	// Jobs stored after the scheduler last read how far the hold delivered: it reads again
	// (once) and releases them by acknowledgement too.
	const more = 25
	for i := range more {
		publishR(t, ctx, qs, "deep")
		publishR(t, ctx, qs, fmt.Sprintf("new%02d", i))
	}
	waitHeld(t, ctx, js, qs, 2*more)
	s.refreshed = time.Time{}
	before = apiTotal(t, ns)
	rounds = moveAll(t, ctx, s, 2*more)
	api = apiTotal(t, ns) - before
	t.Logf("%d more jobs moved in %d rounds: %d JetStream API requests, %d removed by deletion", 2*more, rounds, api, s.deleted.Load())
	if api > uint64(8*rounds) {
		t.Errorf("the later moves sent %d JetStream API requests in %d rounds; want a few per round", api, rounds)
	}
	if n := s.deleted.Load(); n != 0 {
		t.Errorf("%d moved jobs were deleted; want all released by acknowledgement", n)
	}
	if b, d := backlogAndDelivery(t, ctx, js, s); b != 0 || d != singles+deep+2*more {
		t.Errorf("backlog holds %d, delivery stream %d; want 0 and %d", b, d, singles+deep+2*more)
	}
}

// A backlog without its hold (made before it) is emptied by deletions and purges as before:
// every job moved once and gone from the backlog.
func TestFairReleaseWithoutHold(t *testing.T) {
	const singles, deep = 50, 20
	ctx, _, js, qs := releaseSetup(t, singles, deep)
	s, err := New(qs, "r", Options{Target: 2 * (singles + deep)})
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteConsumer(ctx, s.l.Backlog, s.l.Hold); err != nil {
		t.Fatal(err)
	}
	if err := s.open(ctx); err != nil {
		t.Fatal(err)
	}
	moveAll(t, ctx, s, singles+deep)
	if s.hold != nil {
		t.Fatal("the scheduler found a hold consumer that was deleted")
	}
	if n := s.deleted.Load(); n != singles {
		t.Errorf("%d moved jobs were deleted; want the %d single ones (the deep tenant's by one purge)", n, singles)
	}
	if b, d := backlogAndDelivery(t, ctx, js, s); b != 0 || d != singles+deep {
		t.Errorf("backlog holds %d, delivery stream %d; want 0 and %d", b, d, singles+deep)
	}
}
