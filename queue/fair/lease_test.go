package fair

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// bucket returns a fresh key-value bucket on a server of the test's own.
func bucket(t *testing.T) (context.Context, jetstream.KeyValue) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	js, err := jetstream.New(testenv.Connect(t, testenv.NATS(t).URL))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: testenv.Name(t)})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, kv
}

// clock is a test's clock for one lease.
type clock struct{ t time.Time }

func (c *clock) now() time.Time           { return c.t }
func (c *clock) add(d time.Duration)      { c.t = c.t.Add(d) }
func withClock(l *lease, c *clock) *lease { l.now = c.now; return l }

// One holder at a time; a lease whose revision stands still for leaseExpire on the other's
// clock is taken over, a renewed one never; the old holder learns it lost; a released lease
// is free at once.
func TestLease(t *testing.T) {
	ctx, kv := bucket(t)
	ca, cb := &clock{time.Unix(1000, 0)}, &clock{time.Unix(5000, 0)} // no two clocks agree
	a := withClock(newLease(kv, "fair.q"), ca)
	b := withClock(newLease(kv, "fair.q"), cb)
	renew := func(l *lease, name string, want bool) {
		t.Helper()
		got, err := l.renew(ctx)
		if err != nil {
			t.Fatalf("%s: renew: %v", name, err)
		}
		if got != want || l.held() != want {
			t.Fatalf("%s: renew = %v (held %v), want %v", name, got, l.held(), want)
		}
	}
	renew(a, "a takes the free lease", true)
	renew(b, "b while a holds it", false)
	for range 5 { // a renews: however long b waits, the revision moves
		ca.add(leaseRenew)
		cb.add(leaseExpire)
		renew(a, "a renews", true)
		renew(b, "b while a renews", false)
	}
	// a stops renewing: b takes over once the revision stood still leaseExpire on b's clock.
	cb.add(leaseExpire - time.Millisecond)
	renew(b, "b before expiry", false)
	cb.add(time.Millisecond)
	renew(b, "b at expiry", true)
	if _, err := a.renew(ctx); err == nil || a.held() {
		t.Fatalf("a renewed a lease b took over: err %v, held %v", err, a.held())
	}
	renew(a, "a while b holds it", false)

	b.release(ctx)
	if b.held() {
		t.Fatal("b holds the lease it released")
	}
	renew(a, "a right after b released it", true)

	// A deleted entry is taken as a free one.
	a.release(ctx)
	if err := kv.Delete(ctx, "fair.q"); err != nil {
		t.Fatal(err)
	}
	renew(b, "b after the entry was deleted", true)
}

// Two processes racing for a free lease: exactly one gets it, and the other's lost race is no
// error.
func TestLeaseRace(t *testing.T) {
	ctx, kv := bucket(t)
	for i := range 10 {
		key := "fair.q" + string(rune('a'+i))
		ls := []*lease{newLease(kv, key), newLease(kv, key), newLease(kv, key)}
		got := make(chan bool, len(ls))
		for _, l := range ls {
			go func() {
				ok, err := l.renew(ctx)
				if err != nil {
					t.Error(err)
				}
				got <- ok
			}()
		}
		held := 0
		for range ls {
			if <-got {
				held++
			}
		}
		if held != 1 {
			t.Fatalf("%d holders of %s, want 1", held, key)
		}
	}
}
