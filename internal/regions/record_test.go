package regions

import (
	"math/rand/v2"
	"testing"
	"time"
)

// recordRun renews a record in a test: each step checks that what the regions hold never
// exceeds the budget.
type recordRun struct {
	t     *testing.T
	terms Terms
	rec   Record
	now   time.Time
}

func newRecordRun(t *testing.T, terms Terms) *recordRun {
	t0 := time.Unix(1_000_000, 0)
	r := &recordRun{t: t, terms: terms, rec: Fresh(terms, t0), now: t0.Add(terms.Lease)}
	return r
}

func (r *recordRun) renew(region, holder string, demand float64) Lease {
	r.t.Helper()
	var l Lease
	r.rec, l = Renew(r.rec, region, holder, demand, r.terms, r.now)
	if h := r.rec.Held(r.now); h > r.terms.Budget+1e-9 {
		r.t.Fatalf("at %v: held %v > budget", r.now, h)
	}
	return l
}

// TestRenewLoweringCountedUntilAcknowledged: region a's two holders hold 50 each of 100; a's
// demand falls. The lowering by one holder frees nothing while the other still applies 50:
// region b gets the freed budget only once a's other holder acknowledged (renewed) and the
// slots it reserved ahead are spent (Lingers) — and then at once, when a watching holder
// renews at Retry, not a linger of a renew period later.
func TestRenewLoweringCountedUntilAcknowledged(t *testing.T) {
	terms := Terms{Budget: 100, Lease: 2 * time.Second, Renew: 500 * time.Millisecond, Lingers: 200 * time.Millisecond}
	r := newRecordRun(t, terms)
	r.renew("a", "a1", 100)
	r.renew("a", "a2", 100)
	r.renew("b", "b1", 100)
	r.renew("a", "a1", 100)
	r.renew("a", "a2", 100)
	r.now = r.now.Add(terms.Lingers)
	if la1, la2, lb := r.renew("a", "a1", 100), r.renew("a", "a2", 100), r.renew("b", "b1", 100); la1.Share != 50 || la2.Share != 50 || lb.Share != 50 {
		t.Fatalf("both regions busy: a %v/%v b %v; want 50 each", la1.Share, la2.Share, lb.Share)
	}
	if l := r.renew("a", "a1", 10); l.Share != 10 {
		t.Fatalf("a1 with a's demand at 10: %v; want 10", l.Share)
	}
	r.now = r.now.Add(terms.Lingers) // a1's former share no longer lingers
	if l := r.renew("b", "b1", 100); l.Share != 50 || !l.Retry.IsZero() {
		t.Fatalf("b while a2 still applies 50: %+v; want 50, no retry (a2's entry expires beyond a renew period)", l)
	}
	if at, ok := Wants(r.rec, "b", "b1", 100, terms, r.now); ok {
		t.Fatalf("b1 wants a renewal at %v; nothing changed for it", at)
	}
	// a2 sees (a watch) that its region's share was lowered: its renewal matters now.
	if at, ok := Wants(r.rec, "a", "a2", 10, terms, r.now); !ok || !at.Equal(r.now) {
		t.Fatalf("a2 wants %v %v; want a renewal at once (it must acknowledge)", at, ok)
	}
	ack := r.now
	if l := r.renew("a", "a2", 10); l.Share != 10 {
		t.Fatalf("a2's acknowledgement: %v; want 10", l.Share)
	}
	// b sees a2's write: the budget frees up once a2's reserved slots are spent.
	at, ok := Wants(r.rec, "b", "b1", 100, terms, r.now)
	if !ok || !at.Equal(ack.Add(terms.Lingers)) {
		t.Fatalf("b1 wants %v %v; want a renewal at %v, when a2's former share stops lingering", at, ok, ack.Add(terms.Lingers))
	}
	r.now = at.Add(-time.Millisecond)
	if l := r.renew("b", "b1", 100); l.Share != 50 {
		t.Fatalf("b before a2's linger ended: %v; want 50", l.Share)
	}
	r.now = at
	if l := r.renew("b", "b1", 100); l.Share != 90 {
		t.Fatalf("b once every holder of a acknowledged: %v; want 90", l.Share)
	}
}

// TestRenewHolderExpiryFrees: a holder that stops renewing (a dead process) counts until its
// entry expires, then not at all; one that stops cleanly (Release) counts only for Lingers.
func TestRenewHolderExpiryFrees(t *testing.T) {
	terms := Terms{Budget: 100, Lease: 2 * time.Second, Renew: 500 * time.Millisecond, Lingers: 200 * time.Millisecond}
	r := newRecordRun(t, terms)
	r.renew("a", "a1", 100)
	r.renew("a", "dead", 100)
	r.renew("b", "b1", 100)
	r.now = r.now.Add(terms.Lingers)
	r.renew("a", "a1", 100)
	r.renew("a", "dead", 100) // its last renewal
	r.renew("b", "b1", 100)
	deadExpires := r.rec.Leases["a"].Holders["dead"].Expires
	r.now = r.now.Add(100 * time.Millisecond)
	r.renew("a", "a1", 0) // a's demand is gone; a1 acknowledges at once
	for r.now.Before(deadExpires.Add(-terms.Renew)) {
		r.now = r.now.Add(terms.Renew)
		r.renew("a", "a1", 0)
		if l := r.renew("b", "b1", 100); l.Share != 50 {
			t.Fatalf("b at %v while a's dead holder's entry is unexpired: %v; want 50", deadExpires.Sub(r.now), l.Share)
		}
	}
	l := r.renew("b", "b1", 100)
	if !l.Retry.Equal(deadExpires) {
		t.Fatalf("b within a renew period of the dead holder's expiry: retry %v; want %v", l.Retry, deadExpires)
	}
	r.now = deadExpires
	if l := r.renew("b", "b1", 100); l.Share != 100 {
		t.Fatalf("b once the dead holder's entry expired: %v; want 100", l.Share)
	}
	if _, ok := r.rec.Leases["a"].Holders["dead"]; ok {
		t.Errorf("the dead holder's expired entry is still in the record")
	}
	// b1 stops cleanly: a gets the budget once its reserved slots are spent.
	r.rec = Release(r.rec, "b", "b1", terms, r.now)
	r.now = r.now.Add(terms.Lingers - time.Millisecond)
	if l := r.renew("a", "a1", 100); l.Share != 0 {
		t.Fatalf("a within Lingers of b1's release: %v; want 0", l.Share)
	}
	r.now = r.now.Add(time.Millisecond)
	if l := r.renew("a", "a1", 100); l.Share != 50 {
		t.Fatalf("a after b1's release: %v; want 50 (b's demand still counts until its lease's term ends)", l.Share)
	}
}

// TestRenewNeverOverBudgetInterleaved is the rule's property: over random interleavings of
// renewals by the holders of three regions (two holders each in a and b), with random demands,
// releases and silences, the sum over regions of the largest share any holder may apply (its
// acknowledged share until its entry expires; its former share for the slots it reserved ahead
// before a lowering, applied before the write) never exceeds the budget, and the coordinator
// counts at least what each region may apply.
func TestRenewNeverOverBudgetInterleaved(t *testing.T) {
	terms := Terms{Budget: 100, Minimum: 5, Lease: 2 * time.Second, Renew: 500 * time.Millisecond, Lingers: 200 * time.Millisecond}
	const reserve = 100 * time.Millisecond // a holder's slots reserved ahead: less than Lingers
	type use struct {
		share, former       float64
		expires, formerTill time.Time
	}
	holders := []struct{ region, id string }{{"a", "a1"}, {"a", "a2"}, {"b", "b1"}, {"b", "b2"}, {"c", "c1"}}
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 42))
		r := newRecordRun(t, terms)
		uses := map[string]use{}
		applied := func(u use, now time.Time) float64 {
			s := 0.0
			if now.Before(u.expires) {
				s = u.share
			}
			if now.Before(u.formerTill) {
				s = max(s, u.former)
			}
			return s
		}
		check := func(step int) {
			sum := 0.0
			for _, region := range []string{"a", "b", "c"} {
				most := 0.0
				for _, h := range holders {
					if h.region == region {
						most = max(most, applied(uses[h.id], r.now))
					}
				}
				if counted := r.rec.Holds(region, r.now); most > counted+1e-9 {
					t.Fatalf("seed %d step %d: region %s may apply %v, the coordinator counts %v", seed, step, region, most, counted)
				}
				sum += most
			}
			if sum > terms.Budget+1e-9 {
				t.Fatalf("seed %d step %d: the regions may apply %v > budget %v", seed, step, sum, terms.Budget)
			}
		}
		for step := range 400 {
			r.now = r.now.Add(time.Duration(rng.Int64N(int64(300 * time.Millisecond))))
			check(step)
			h := holders[rng.IntN(len(holders))]
			u := uses[h.id]
			switch op := rng.IntN(10); {
			case op == 0: // stops cleanly: nothing applied from now, but what it reserved
				r.rec = Release(r.rec, h.region, h.id, terms, r.now)
				if s := applied(u, r.now); s > 0 {
					u = use{former: s, formerTill: r.now.Add(reserve)}
				}
			case op == 1: // silent this step
			default:
				l := r.renew(h.region, h.id, float64(rng.IntN(120)))
				if now := applied(u, r.now); l.Share < now { // lowered before the write
					u.former, u.formerTill = now, r.now.Add(reserve)
				}
				u.share, u.expires = l.Share, l.Expires
			}
			uses[h.id] = u
			check(step)
		}
	}
}
