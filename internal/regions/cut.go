package regions

import (
	"math"
	"time"

	"github.com/sluice-rl/sluice/limit"
)

// cutSlack absorbs the rounding of share ÷ budget × limit: a region holding exactly half of a
// limit of 1000 (a share of 8.3333… of a budget of 16.6666… per second) is cut to 500, not
// 499.
const cutSlack = 1e-6

// Cut is spec with its limit cut to the part f (in [0, 1]) of it that a region's lease of a
// global rule allows, rounded down, so that the regions' limits never sum to more than the
// rule's; a burst the same, at least 1 when spec has one. It reports false when the part
// admits nothing (less than one request per period, a share of 0): the request is then
// refused without asking the limiter, which cannot decide a limit of 0. A part of 1 or more
// (or NaN) is spec itself.
func Cut(spec limit.Limit, f float64) (limit.Limit, bool) {
	if !(f < 1) {
		return spec, true
	}
	f = max(f, 0)
	spec.Limit = int64(math.Floor(float64(spec.Limit)*f + cutSlack))
	if spec.Burst > 0 {
		spec.Burst = max(1, int64(math.Floor(float64(spec.Burst)*f+cutSlack)))
	}
	return spec, spec.Limit > 0
}

// Limit counts one decision against key's budget (as Fraction does: the region's demand) and
// returns spec cut to the region's part of it now (Cut), false when that part admits nothing,
// and how long until the holder's next renewal, when a request refused for want of a share
// may ask again. A key the holder does not keep is spec itself. The ingress's HTTP path and
// its Envoy rate-limit service both decide a global rule through it: one share, one demand.
func (h *Holder) Limit(key string, spec limit.Limit) (limit.Limit, time.Duration, bool) {
	cut, ok := Cut(spec, h.Fraction(key))
	return cut, h.untilRenewal(), ok
}
