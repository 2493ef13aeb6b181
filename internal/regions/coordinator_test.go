package regions

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// TestCoordinatorConcurrentRenewals: workers of two regions renew at once on a real JetStream
// key-value bucket; compare-and-set loses none of their writes, and the record never holds
// more than the budget. A bucket that lost its state starts a hold again.
func TestCoordinatorConcurrentRenewals(t *testing.T) {
	srv := testenv.NATS(t)
	js, err := jetstream.New(testenv.Connect(t, srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	terms := Terms{Budget: 50, Lease: 300 * time.Millisecond, Renew: 50 * time.Millisecond, Lingers: 20 * time.Millisecond}
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	var coords []*Coordinator
	for _, region := range []string{"a", "a", "b", "b"} { // two workers per region
		c := NewCoordinator(js, region, nil)
		coords = append(coords, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				if _, _, err := c.Renew(ctx, "llm", 100, terms, nil); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, Bucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "llm")
	if err != nil {
		t.Fatal(err)
	}
	var rec Record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		t.Fatal(err)
	}
	// Each renewal writes once; a write whose answer timed out is tried again (Renew), and
	// may have landed, so the writes beyond 80 are bounded by the tries that did not lose a
	// race: exactly 80 when no answer timed out.
	var unraced int64
	for _, c := range coords {
		tried, conflicts := c.Writes()
		unraced += tried - conflicts
	}
	if rev := int64(e.Revision()); rev < 80 || rev > unraced || len(rec.Leases) != 2 {
		t.Fatalf("revision %d with leases %v; want 80 writes (4 workers × 20) of two regions, at most %d with the tries whose answer timed out", rev, rec.Leases, unraced)
	}
	t.Logf("revision %d; %d writes tried that lost no race", e.Revision(), unraced)
	if h := rec.Held(time.Now()); h > terms.Budget {
		t.Fatalf("held %v > budget", h)
	}
	// Both regions share once the fresh record's hold is over.
	a, b := NewCoordinator(js, "a", nil), NewCoordinator(js, "b", nil)
	testenv.WaitFor(t, 5*time.Second, "both regions at 25", func() bool {
		la, _, err1 := a.Renew(ctx, "llm", 100, terms, nil)
		lb, _, err2 := b.Renew(ctx, "llm", 100, terms, nil)
		return err1 == nil && err2 == nil && la.Share == 25 && lb.Share == 25
	})
	// The coordinator loses its state: the next renewal makes a fresh record, held for a lease.
	if err := js.DeleteKeyValue(ctx, Bucket); err != nil {
		t.Fatal(err)
	}
	// A renewal may fail while the bucket is made again (its look-up is bounded by half a renew
	// period, 25 ms here, which a loaded machine can exceed); the holder then keeps its lease
	// and renews again. The first renewal that succeeds finds the fresh record, held.
	var (
		l      Lease
		failed []error
	)
	testenv.WaitFor(t, 5*time.Second, "a renewal after the bucket was lost", func() bool {
		l, rec, err = a.Renew(ctx, "llm", 100, terms, nil)
		if err != nil {
			failed = append(failed, err)
		}
		return err == nil
	})
	if l.Share != 0 || !rec.HoldUntil.After(time.Now()) {
		t.Fatalf("after the bucket was lost: %+v, hold until %v (failed renewals before: %v); want no share while held", l, rec.HoldUntil, failed)
	}
}
