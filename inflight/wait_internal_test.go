package inflight

import "testing"

// TestReleaseWakesOneWaiter: a release of a key wakes its longest waiter not yet woken, not
// every waiter; a waiter that leaves without taking its wake passes it to the next.
func TestReleaseWakesOneWaiter(t *testing.T) {
	var ws waiters
	var all []*waiter
	for range 5 {
		all = append(all, ws.add([]string{"k"}))
	}
	other := ws.add([]string{"other"})
	woken := func() (n []int) {
		for i, w := range all {
			if len(w.wake) > 0 {
				n = append(n, i)
			}
		}
		return n
	}
	ws.wakeKey("k")
	if got := woken(); len(got) != 1 || got[0] != 0 {
		t.Fatalf("after one release, woken %v; want [0]", got)
	}
	ws.wakeKey("k")
	if got := woken(); len(got) != 2 || got[1] != 1 {
		t.Fatalf("after two releases, woken %v; want [0 1]", got)
	}
	if len(other.wake) > 0 {
		t.Fatal("a waiter of another key was woken")
	}
	// The first leaves without taking its wake: it goes to the next not yet woken.
	ws.remove(all[0])
	all = all[1:]
	if got := woken(); len(got) != 2 || got[0] != 0 || got[1] != 1 {
		t.Fatalf("after the first left with its wake, woken %v; want [0 1] (the next took it)", got)
	}
	// One takes its wake (its attempt), then leaves: nothing is passed on.
	<-all[0].wake
	ws.remove(all[0])
	all = all[1:]
	if got := woken(); len(got) != 1 || got[0] != 0 {
		t.Fatalf("after a waiter took its wake and left, woken %v; want [0]", got)
	}
	ws.close()
	for i, w := range append(all, other) {
		if len(w.wake) == 0 {
			t.Errorf("waiter %d not woken by close", i)
		}
	}
}
