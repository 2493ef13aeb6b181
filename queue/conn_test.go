package queue_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/connect"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// inFlightBudget is how soon after nats-server crashed a publish caught in flight must fail:
// the contract's 250 ms for a deferral while NATS is unreachable.
const inFlightBudget = 250 * time.Millisecond

// TestPublishesInFlightAtACrashFailAtOnce: when nats-server crashes under a stream of
// publishes — plain jobs, jobs with an Idempotency-Key (a request to the status bucket before
// the publish) and jobs of a fair queue — every publish then in flight fails within 250 ms of
// the crash, and every publish begun after it within 250 ms of its start, on a connection made
// as the ingress makes it (no reconnect buffer). So that every publisher is in flight at the
// crash, the server is first stopped (SIGSTOP) until each waits on it, then killed.
// A keyed job's idempotency check used to wait for its 2 s deadline.
func TestPublishesInFlightAtACrashFailAtOnce(t *testing.T) {
	srv := testenv.NATSProc(t)
	nc, err := connect.NATS(srv.URL, t.Name(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	q, err := queue.New(ctx, js, queue.Options{Prefix: testenv.Name(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		q.Close(cctx) //nolint:errcheck // the server is gone: retractions cannot finish
	})
	if err := q.Provision(ctx, []queue.Spec{{Name: "q"}, {Name: "f", Fair: true}}); err != nil {
		t.Fatal(err)
	}

	var (
		mu     sync.Mutex
		killed time.Time
		late   []string
		caught int           // publishes in flight at the kill
		worst  time.Duration // the longest a failed publish took after the kill
		ok     = map[string]int{}
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var stopped atomic.Bool
	var stuck atomic.Int32 // publishes begun after the server stopped, not yet returned
	const publishers = 24
	for i := range publishers {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				j, kind := &queue.Job{Queue: "q", Body: []byte("x")}, "plain"
				switch i % 3 {
				case 1:
					j.IdempotencyKey, kind = fmt.Sprintf("order-%d-%d", i, n), "keyed"
				case 2:
					j.Queue, j.Tenant, kind = "f", "t", "fair"
				}
				start := time.Now()
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				waits := stopped.Load() // nothing answers this one before the kill
				if waits {
					stuck.Add(1)
				}
				_, err := q.Publish(pctx, j)
				if waits {
					stuck.Add(-1)
				}
				cancel()
				end := time.Now()
				mu.Lock()
				switch {
				case err == nil:
					ok[kind]++
				case !killed.IsZero():
					from := killed // in flight at the kill, or begun after it
					if start.After(killed) {
						from = start
					}
					if start.Before(killed) {
						caught++
					}
					worst = max(worst, end.Sub(from))
					if end.Sub(from) > inFlightBudget {
						late = append(late, fmt.Sprintf("%s job: failed %v after the kill (%v after its start): %v",
							kind, end.Sub(killed).Round(time.Millisecond), end.Sub(start).Round(time.Millisecond), err))
					}
				}
				mu.Unlock()
				if err != nil {
					select { // the server is gone: try again soon, as clients of the ingress would
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
				}
			}
		})
	}
	// Kill once every kind of publish has succeeded a few times: the stream is in full flow.
	testenv.WaitFor(t, 10*time.Second, "publishes of every kind", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return ok["plain"] >= 20 && ok["keyed"] >= 20 && ok["fair"] >= 20
	})
	// Once the server is stopped, every publisher ends up waiting on a publish begun after
	// that (those begun before may have had their answers on the way, or wait out their 2 s).
	srv.Stop()
	stopped.Store(true)
	testenv.WaitFor(t, 5*time.Second, "every publisher to wait on the stopped server", func() bool {
		return stuck.Load() == publishers
	})
	mu.Lock()
	killed = time.Now()
	mu.Unlock()
	srv.Kill()
	// Publishes keep failing meanwhile; give the slowest in flight its whole 2 s deadline.
	after := time.Now().Add(2500 * time.Millisecond)
	testenv.WaitFor(t, 5*time.Second, "2.5 s of publishes after the kill", func() bool { return time.Now().After(after) })
	close(stop)
	wg.Wait()
	t.Logf("%d publishes in flight at the kill; the slowest failure came %v after the kill or its start", caught, worst)
	if caught < publishers {
		t.Fatalf("%d publishes in flight at the kill, want %d", caught, publishers)
	}
	for _, l := range late {
		t.Error(l)
	}
}
