package leaky

import (
	"testing"
	"time"
)

// TestServerClock feeds the clock filter samples at fixed instants, from a server whose clock
// reads base µs more than the local one: the bounds always hold the true offset (-base), the
// fastest round trip sets their width, a slow reply is placed within them, they widen with
// time, and they start afresh when a sample contradicts them.
func TestServerClock(t *testing.T) {
	c := newServerClock()
	at := func(us int64) time.Time { return c.origin.Add(time.Duration(us) * time.Microsecond) }
	base := int64(5_000_000_000)
	// take is a take sent at local µs s, read by the server at local µs x, answered at r.
	var young bool
	take := func(s, x, r int64) (lo, hi int64) {
		t.Helper()
		lo, hi, young = c.observe(at(s), at(r), x+base)
		if lo > -base || hi < -base {
			t.Fatalf("take [%d, %d, %d]: bounds [%d, %d] miss the offset", s, x, r, lo+base, hi+base)
		}
		return lo + base, hi + base
	}

	if lo, hi := take(0, 700, 1000); lo != -700 || hi != 300 || !young {
		t.Fatalf("first take: bounds [%d, %d], young %v; want its own round trip [-700, 300], young", lo, hi, young)
	}
	if lo, hi := take(10_000, 10_100, 10_200); hi-lo > 200 {
		t.Fatalf("after a 200µs round trip: bounds [%d, %d], want at most its width", lo, hi)
	}
	// A take held up 20ms on its way back: its own round trip would place the server's reading
	// anywhere in 20ms; the bounds place it within about 200µs.
	lo, hi := take(30_000, 30_050, 50_050)
	if hi-lo > 220 {
		t.Fatalf("after a slow reply: bounds [%d, %d], want the earlier width", lo, hi)
	}
	if got := c.local(30_050+base, hi-base); got.Before(at(30_050)) || got.After(at(30_300)) {
		t.Fatalf("the slow take's reading placed at %v, want within 250µs after 30.05ms", got.Sub(c.origin))
	}
	// 100s without samples: the bounds widen by 500ppm, 50ms each way, so a sample anywhere
	// within 40ms fits them.
	if lo, hi := take(100_050_000, 100_090_000, 100_090_100); hi-lo > 100_000+220 || hi-lo < 100 || young {
		t.Fatalf("after 100s: bounds [%d, %d], young %v; want no longer young", lo, hi, young)
	}
	// The server's clock is stepped back 1s: the next sample contradicts the bounds, which
	// start again from it.
	base -= 1_000_000
	if lo, hi := take(100_200_000, 100_200_100, 100_200_300); lo != -100 || hi != 200 || !young {
		t.Fatalf("after a clock step: bounds [%d, %d], young %v; want the sample's own [-100, 200], young again", lo, hi, young)
	}
}
