package worker

import (
	"math"
	"testing"
	"time"
)

// The drain rate is deliveries over the last ten seconds, per queue, and forgets older ones.
func TestDrainRate(t *testing.T) {
	now := time.Unix(1000, 0)
	d := newDrainRate(func() time.Time { return now })
	for s := range 10 { // 20 deliveries a second for 10 seconds
		now = time.Unix(1000+int64(s), 0)
		for range 20 {
			d.add("q")
		}
	}
	d.add("other")
	now = time.Unix(1009, 999_999_999) // the end of the tenth second: 200 in ~10s
	if got := d.rate("q"); math.Abs(got-20) > 0.01 {
		t.Errorf("rate after 10s at 20/s = %v, want 20", got)
	}
	now = time.Unix(1014, 500_000_000) // seconds 1005..1009 remain: 100 in 9.5s
	if got, want := d.rate("q"), 100/9.5; math.Abs(got-want) > 0.01 {
		t.Errorf("rate 5s later = %v, want %v", got, want)
	}
	now = time.Unix(1030, 0)
	if got := d.rate("q"); got != 0 {
		t.Errorf("rate after 20 idle seconds = %v, want 0", got)
	}
	d.forget("q")
	if got := d.rate("q"); got != 0 {
		t.Errorf("rate of a forgotten queue = %v, want 0", got)
	}
}

// Canceled ids are forgotten after cancelMemory, unless a job of that id is in hand.
func TestPruneCanceled(t *testing.T) {
	p := &Pool{}
	now := time.Now()
	p.canceled.Store("old", now.Add(-2*cancelMemory))
	p.canceled.Store("old-held", now.Add(-2*cancelMemory))
	p.canceled.Store("new", now.Add(-cancelMemory/2))
	p.inHand.Store("old-held", struct{}{})
	p.pruneCanceled(now)
	for id, want := range map[string]bool{"old": false, "old-held": true, "new": true} {
		if _, got := p.canceled.Load(id); got != want {
			t.Errorf("%s remembered: %v, want %v", id, got, want)
		}
	}
}
