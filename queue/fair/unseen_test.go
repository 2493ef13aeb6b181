package fair

import (
	"testing"
	"time"
)

// A moved job counts as waiting until the consumer delivers it, or for unseenFor at most.
func TestUnseen(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	var u unseen
	u.add([]uint64{12, 10, 11}, t0) // tenants move in parallel: any order
	if got := u.waiting(9, t0); got != 3 {
		t.Fatalf("none delivered: %d waiting, want 3", got)
	}
	if got := u.waiting(11, t0.Add(time.Millisecond)); got != 1 {
		t.Fatalf("delivered up to 11: %d waiting, want 1", got)
	}
	u.add([]uint64{13}, t0.Add(50*time.Millisecond))
	if got := u.waiting(0, t0.Add(unseenFor)); got != 1 { // a consumer made anew counts from 0
		t.Fatalf("after unseenFor: %d waiting, want 1 (13, moved later)", got)
	}
	if got := u.waiting(0, t0.Add(50*time.Millisecond+unseenFor)); got != 0 || len(u.moves) != 0 {
		t.Fatalf("all past unseenFor: %d waiting, %d kept", got, len(u.moves))
	}
}
