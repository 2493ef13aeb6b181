package leaky

import (
	"context"
	"testing"
	"time"
)

// TestGrid: above StrictRate a wait ends on a multiple of Grid, never before its slot, and at
// most Grid after it; at StrictRate and below there is no grid.
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

	// A wait at 1000/s on the real clock: each slot still ahead when taken is let go at or
	// after the grid instant of its slot, which is at most Grid after it.
	s := NewMemory(nil)
	r := Every(1000, time.Second)
	ahead := 0
	for ahead < 5 {
		var at, taken time.Time
		h := Hooks{OnTake: func(a time.Time) { at, taken = a, time.Now() }}
		if err := WaitHooks(context.Background(), s, "q", r, h); err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		if !at.After(taken) {
			continue // free at once: it goes without a sleep
		}
		ahead++
		if g := onGrid(at, Grid); now.Before(g) || g.Sub(at) > Grid {
			t.Fatalf("slot at %v let go at %v: want at or after its grid instant %v", at, now, g)
		}
	}
}
