package limit

import (
	"math"
	"math/bits"
	"time"
)

// fill returns min(most, level + elapsed × rate), for level <= most (a level below 0 is debt). The product may
// overflow 64 bits after a long idle time, so it is taken in 128 (the Lua scripts, where it
// would lose exactness, compare elapsed with ceil((most - level) / rate) instead: the same
// result).
func fill(level, most, elapsed, rate int64) int64 {
	hi, lo := bits.Mul64(uint64(elapsed), uint64(rate))
	if hi != 0 || lo >= uint64(most-level) {
		return most
	}
	return level + int64(lo)
}

// drain returns max(0, level - elapsed × rate), for level >= 0; see fill.
func drain(level, elapsed, rate int64) int64 {
	hi, lo := bits.Mul64(uint64(elapsed), uint64(rate))
	if hi != 0 || lo >= uint64(level) {
		return 0
	}
	return level - int64(lo)
}

// rescale converts v from one scale to another after a limit changed. It rounds, so it is done
// in float64 exactly as the Lua scripts do it (IEEE division then multiplication).
func rescale(v, from, to int64) int64 {
	return int64(math.Floor(float64(v) / float64(from) * float64(to)))
}

// ceilDiv returns ceil(a / b) for a >= 0, b > 0.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if q*b < a {
		q++
	}
	return q
}

// gcd returns the greatest common divisor of a, b > 0, by Stein's binary algorithm: shifts and
// subtractions, no division, since it runs on every decision.
func gcd(a, b int64) int64 {
	x, y := uint64(a), uint64(b)
	shift := bits.TrailingZeros64(x | y)
	x >>= bits.TrailingZeros64(x)
	for y != 0 {
		y >>= bits.TrailingZeros64(y)
		if x > y {
			x, y = y, x
		}
		y -= x
	}
	return int64(x << shift)
}

// instant returns the Decision.At of t µs since the Unix epoch.
func instant(t int64) time.Time { return time.UnixMicro(t).UTC() }

// micros returns t in µs since the Unix epoch; instants before 1970 count as the epoch.
func micros(t time.Time) int64 { return max(0, t.UnixMicro()) }

// us converts µs to a Duration.
func us(n int64) time.Duration { return time.Duration(n) * time.Microsecond }
