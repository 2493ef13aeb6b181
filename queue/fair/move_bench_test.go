package fair

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// BenchmarkMove is the scheduler's cost per job moved, by jobs and by units, end to end on an
// embedded NATS server: 2 000 jobs of 10 tenants (costs 10 to 70 units) wait in the backlogs,
// and rounds of a scheduler with a lookahead of all of them, called back to back as Run calls
// them while they move jobs, move them to the delivery stream: a rereading of the backlogs, the
// consumer's count, the picks, the batched gets, the publishes and their acks, the purges. One
// op is that whole move; ns/move is the figure. By units each job's envelope is decoded for its
// cost and charged, and a tenant new to the ring moves one job before the rest. Run it with
//
//	go test -run '^$' -bench Move -benchtime 5x ./queue/fair/
func BenchmarkMove(b *testing.B) {
	const jobs, tenants = 2000, 10
	for _, byUnits := range []bool{false, true} {
		mode := "jobs"
		if byUnits {
			mode = "units"
		}
		b.Run("by="+mode, func(b *testing.B) {
			ctx, qs, js := moveSetup(b)
			s, err := New(qs, "m", Options{Target: jobs, ByUnits: byUnits})
			if err != nil {
				b.Fatal(err)
			}
			var elapsed time.Duration
			for range b.N {
				publishCosts(b, ctx, qs, jobs, tenants)
				s.refreshed = time.Time{} // the round rereads the backlogs, as after Run's first 500ms
				start := time.Now()
				for moved := 0; moved < jobs; {
					n, err := s.round(ctx)
					if err != nil {
						b.Fatal(err)
					}
					moved += n
				}
				elapsed += time.Since(start)
				st, err := js.Stream(ctx, s.l.Delivery)
				if err == nil {
					err = st.Purge(ctx)
				}
				if err != nil {
					b.Fatal(err)
				}
				s.ahead = ahead{} // the purged jobs are not waiting
			}
			b.ReportMetric(float64(elapsed.Nanoseconds())/float64(b.N*jobs), "ns/move")
		})
	}
}

// moveSetup provisions fair queue m on an embedded NATS server.
func moveSetup(b *testing.B) (context.Context, *queue.Queues, jetstream.JetStream) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	b.Cleanup(cancel)
	js, err := jetstream.New(testenv.Connect(b, testenv.NATS(b).URL))
	if err != nil {
		b.Fatal(err)
	}
	qs, err := queue.New(ctx, js, queue.Options{Prefix: testenv.Name(b)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { qs.Close(context.Background()) })
	if err := qs.Provision(ctx, []queue.Spec{{Name: "m", Fair: true}}); err != nil {
		b.Fatal(err)
	}
	return ctx, qs, js
}

// publishCosts publishes n jobs to queue m, job i of tenant i%tenants costing (i%7+1) × 10
// units, 16 at a time.
func publishCosts(b *testing.B, ctx context.Context, qs *queue.Queues, n, tenants int) {
	b.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 16)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_, err := qs.Publish(ctx, &queue.Job{Queue: "m", Tenant: fmt.Sprintf("t%d", i%tenants), Cost: int64(i%7+1) * 10,
				Method: "POST", Path: "/x", Body: []byte("x")})
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// BenchmarkMoveTenants is the scheduler's cost per job moved with 10 000 jobs of 1 or 10 000
// tenants (one job each), by jobs, on an embedded NATS server, with the worker's largest
// lookahead (512 jobs): rounds back to back as Run calls them, the delivery stream emptied
// between rounds as workers would (not timed). ns/move is the figure; the ratio of the two is
// what BenchmarkFairDrain of cmd/worker measures end to end. Run it with
//
//	go test -run '^$' -bench MoveTenants -benchtime 2x ./queue/fair/
func BenchmarkMoveTenants(b *testing.B) {
	const jobs, target = 10_000, 512
	for _, tenants := range []int{1, 10_000} {
		b.Run(fmt.Sprintf("tenants=%d", tenants), func(b *testing.B) {
			ctx, qs, js := moveSetup(b)
			s, err := New(qs, "m", Options{Target: target})
			if err != nil {
				b.Fatal(err)
			}
			if err := s.open(ctx); err != nil {
				b.Fatal(err)
			}
			st, err := js.Stream(ctx, s.l.Delivery)
			if err != nil {
				b.Fatal(err)
			}
			var elapsed time.Duration
			for range b.N {
				publishCosts(b, ctx, qs, jobs, tenants)
				s.refreshed = time.Time{}
				for moved := 0; moved < jobs; {
					start := time.Now()
					n, err := s.round(ctx)
					elapsed += time.Since(start)
					if err != nil {
						b.Fatal(err)
					}
					moved += n
					if err := st.Purge(ctx); err != nil {
						b.Fatal(err)
					}
					s.ahead = ahead{}
				}
			}
			b.ReportMetric(float64(elapsed.Nanoseconds())/float64(b.N*jobs), "ns/move")
		})
	}
}
