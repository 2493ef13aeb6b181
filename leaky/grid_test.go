package leaky

import (
	"context"
	"testing"
	"time"
)

// TestGrid: above StrictRate a wait for a slot reserved ahead ends on a multiple of Grid, never
// before its slot, and at most Grid after it; at StrictRate and below there is no grid.
func TestGrid(t *testing.T) {
	for _, c := range []struct {
		rate Rate
		want time.Duration
	}{
		{Every(10, time.Second), 0},
		{Every(StrictRate, time.Second), 0},
		{Every(StrictRate+1, time.Second), Grid},
		{Every(2000, time.Second), Grid},
		{Rate{}, 0},
	} {
		if got := c.rate.grid(); got != c.want {
			t.Errorf("%v: grid %v, want %v", c.rate, got, c.want)
		}
	}
	base := time.Unix(1_700_000_000, 0)
	for _, c := range []struct{ in, want time.Duration }{
		{0, 0},
		{time.Nanosecond, Grid},
		{Grid - time.Nanosecond, Grid},
		{Grid, Grid},
		{Grid + time.Microsecond, 2 * Grid},
	} {
		if got := onGrid(base.Add(c.in), Grid); !got.Equal(base.Add(c.want)) {
			t.Errorf("onGrid(+%v) = +%v, want +%v", c.in, got.Sub(base), c.want)
		}
	}

	// A wait at 500/s on the real clock: each slot taken more than checkMin ahead is let go at
	// or after the grid instant of its slot, which is at most Grid after it; one closer is let
	// go at its instant (not reserved ahead: an unthrottled queue's).
	s := NewMemory(nil)
	r := Every(500, time.Second)
	checked := 0
	for range 20 {
		take(t, s, "q", r)
		take(t, s, "q", r) // the waited slot is then about 4ms ahead
		var at, taken time.Time
		h := Hooks{OnTake: func(a time.Time) { at, taken = a, time.Now() }}
		if err := WaitHooks(context.Background(), s, "q", r, h); err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		if at.Sub(taken) <= checkMin {
			continue // the machine was slow to get here: not reserved ahead any more
		}
		checked++
		if g := onGrid(at, Grid); now.Before(g) || g.Sub(at) > Grid {
			t.Fatalf("slot at %v let go at %v: want at or after its grid instant %v", at, now, g)
		}
	}
	if checked < 5 {
		t.Fatalf("only %d of 20 slots were reserved more than %v ahead", checked, checkMin)
	}
}
