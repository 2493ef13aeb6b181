package leaky

import (
	"sync"
	"time"
)

// serverClock places instants of a Redis server's clock (TIME, µs) on this process's monotonic
// clock, within bounds. A take's script reads the server's clock at some instant between when
// its request was sent and when its reply arrived, so each take bounds the offset between the
// two clocks by its round trip; the bounds of all takes so far intersect (as NTP's clock filter
// and Marzullo's algorithm do), so the fastest round trip seen sets the precision, however slow
// the take at hand. A slot is then known to within that precision even when its own reply was
// held up, and a slot whose reply arrived late is late by what it really is: neither by the
// slow reply's whole round trip (which the slot need not have waited for) nor by nothing.
//
// The bounds widen at maxDrift while no take narrows them, for the two clocks' rates; a sample
// that contradicts them (the server's clock was stepped, a failover moved the key to another
// server) starts them afresh.
type serverClock struct {
	origin time.Time // the local reference, with its monotonic reading

	mu     sync.Mutex
	lo, hi int64 // bounds, µs, of the offset: local µs since origin − server µs, as of last
	last   int64 // local µs since origin of the latest sample
	born   int64 // local µs since origin when the bounds were last set afresh
	set    bool
}

// youngFor is how long after its bounds are set afresh a clock is young: its bounds may still
// be as wide as the round trips of a loaded start, and a slot is used only if it is on time
// however wide they are. After that, wide bounds are taken for the network's own precision
// (a Redis far away), and slots are placed at the latest bound.
const youngFor = 2 * time.Second

// maxDrift is how fast the bounds widen without samples: 500 ppm, the most NTP slews a clock.
const maxDrift = 500e-6

func newServerClock() *serverClock { return &serverClock{origin: time.Now()} }

// observe adds the sample of a take sent at sent, answered at recv, whose script read server
// (µs) from the server's clock, and returns the bounds of the offset and whether the clock is
// young (youngFor).
func (c *serverClock) observe(sent, recv time.Time, server int64) (lo, hi int64, young bool) {
	s, r := sent.Sub(c.origin).Microseconds(), recv.Sub(c.origin).Microseconds()
	slo, shi := s-server, r-server
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.set {
		w := int64(float64(max(r-c.last, 0))*maxDrift) + 1
		if lo, hi := max(c.lo-w, slo), min(c.hi+w, shi); lo <= hi {
			c.lo, c.hi, c.last = lo, hi, max(r, c.last)
			return lo, hi, r-c.born < youngFor.Microseconds()
		}
	}
	c.lo, c.hi, c.last, c.born, c.set = slo, shi, r, r, true
	return slo, shi, true
}

// bounds returns the bounds of the offset as of now, widened for the time since the last
// sample as observe widens them, and whether the clock is young; ok is false before any sample.
func (c *serverClock) bounds(now time.Time) (lo, hi int64, young, ok bool) {
	n := now.Sub(c.origin).Microseconds()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.set {
		return 0, 0, false, false
	}
	w := int64(float64(max(n-c.last, 0))*maxDrift) + 1
	return c.lo - w, c.hi + w, n-c.born < youngFor.Microseconds(), true
}

// local returns the local instant of server instant server (µs) at offset off.
func (c *serverClock) local(server, off int64) time.Time {
	return c.origin.Add(time.Duration(server+off) * time.Microsecond)
}
