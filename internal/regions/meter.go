package regions

import "time"

// meterSlots is how many slots a meter's window (one renew period) is cut into: the demand's
// resolution in time, and how often a holder checks it for a change between renewals.
const meterSlots = 4

// meter counts a holder's decisions of one budget in slots of a quarter renew period, for the
// region's demand: the rate over the last renew period (the four slots before the current one,
// and the current one so far). Not safe for concurrent use: holding.mu guards it.
type meter struct {
	slot time.Duration
	at   int64 // the current slot's number: Unix nanoseconds ÷ slot
	n    [meterSlots + 1]int64
}

// advance moves the meter to now's slot, emptying the slots passed.
func (m *meter) advance(now time.Time) int64 {
	cur := now.UnixNano() / int64(m.slot)
	if m.at == 0 || cur-m.at > meterSlots {
		m.n = [meterSlots + 1]int64{}
	} else {
		for s := m.at + 1; s <= cur; s++ {
			m.n[s%(meterSlots+1)] = 0
		}
	}
	if cur > m.at {
		m.at = cur
	}
	return cur
}

// add counts one decision at now.
func (m *meter) add(now time.Time) {
	cur := m.advance(now)
	m.n[cur%(meterSlots+1)]++
}

// rate is the decisions per second over the window ending at now: the meterSlots slots before
// now's and now's so far.
func (m *meter) rate(now time.Time) float64 {
	cur := m.advance(now)
	sum := int64(0)
	for _, n := range m.n {
		sum += n
	}
	span := time.Duration(meterSlots)*m.slot + time.Duration(now.UnixNano()-cur*int64(m.slot))
	return float64(sum) / span.Seconds()
}

// demandChanged reports whether a rate measured now differs enough from the demand last
// reported for the holder to renew before its period ends: below half of it (a drop that has
// lasted about half a renew period; a pause shorter than that changes nothing), or above
// twice it, beyond 1% of the budget either way.
func demandChanged(rate, reported, budget float64) bool {
	return rate < reported/2-material*budget || rate > 2*reported+material*budget
}
