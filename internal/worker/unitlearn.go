package worker

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/retry"
)

// Learned unit rates (QueueConfig.Adaptive with a unit budget): cost_rate becomes a ceiling,
// and each worker lowers the units it asks for to what the upstream's answers say it takes:
//
//   - its token limit: X-RateLimit-Limit-Tokens or anthropic-ratelimit-tokens-limit, per
//     minute as both providers count it;
//   - on a 2xx, what spends the tokens it says are left by their reset: X-RateLimit-Remaining-
//     Tokens over X-RateLimit-Reset-Tokens, or anthropic-ratelimit-tokens-remaining over
//     -reset — so a budget running low is stretched to its reset instead of running into a
//     429 (a 429 with such headers pauses the queue until the reset, unitReset);
//   - a RateLimit policy whose quota unit (qu) is not "requests", r over t.
//
// The lowest of these, never above cost_rate nor below a hundredth of it, is the worker's
// learned unit rate until an answer says otherwise, and forgotten after adaptForget without
// one. Each worker learns from its own answers: the upstream says the same to every worker,
// and a take carries the units it asks for, so the schedule follows the lowest at once.
//
// unitLearner is that policy (an observer; the unit budget asks it for units). Safe for
// concurrent use.
type unitLearner struct {
	now     func() time.Time
	mu      sync.Mutex
	perSec  float64 // learned units per second; 0: none
	learned time.Time
}

// tokensPerMinute are the headers that say an upstream's token limit per minute.
var tokensPerMinute = []string{"X-Ratelimit-Limit-Tokens", "Anthropic-Ratelimit-Tokens-Limit"}

// observe feeds the answer of an adaptive unit queue's successful delivery to the learned
// unit rate.
func (u *unitLearner) observe(cfg *QueueConfig, _ *job, a answer) {
	if cfg.Adaptive && !cfg.Units.IsZero() && a.class == retry.Success && a.resp != nil {
		u.learn(a.resp.Header, unitsPerSecond(cfg.Units), u.now())
	}
}

// learn feeds one successful answer to the learned unit rate of a queue whose cost_rate is
// ceiling units per second.
func (u *unitLearner) learn(h http.Header, ceiling float64, now time.Time) {
	rate, ok := unitQuota(h, now)
	if !ok || ceiling <= 0 {
		return
	}
	rate = min(max(rate, ceiling/100), ceiling)
	u.mu.Lock()
	u.perSec, u.learned = rate, now
	u.mu.Unlock()
}

// rate is the learned unit rate in units per second at now, 0 for none.
func (u *unitLearner) rate(now time.Time) float64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.perSec > 0 && now.Sub(u.learned) > adaptForget {
		u.perSec = 0
	}
	return u.perSec
}

// units is budget lowered to the learned rate at now, when one is known and lower.
func (u *unitLearner) units(budget leaky.Units, now time.Time) leaky.Units {
	r := u.rate(now)
	if r <= 0 || budget.Per <= 0 {
		return budget
	}
	n := int64(r * budget.Per.Seconds())
	if n <= 0 || n >= budget.N {
		return budget
	}
	budget.N = n
	return budget
}

// unitQuota is the unit rate an answer's headers say the upstream takes now, in units per
// second: the lowest of its token limit per minute, what spends its remaining tokens by their
// reset, and a RateLimit policy in units other than requests. false when they say none.
func unitQuota(h http.Header, now time.Time) (float64, bool) {
	best, ok := math.Inf(1), false
	for _, name := range tokensPerMinute {
		if n, err := strconv.ParseInt(strings.TrimSpace(h.Get(name)), 10, 64); err == nil && n > 0 {
			best, ok = min(best, float64(n)/60), true
		}
	}
	for _, q := range tokensLeft(h, now) {
		best, ok = min(best, float64(q.left)/q.reset.Seconds()), true
	}
	units := retry.Units(h)
	for _, l := range retry.ParseRateLimit(h) {
		if u, named := units[l.Policy]; named && u != "requests" && u != "concurrent-requests" && l.HasReset && l.Reset > 0 {
			best, ok = min(best, float64(l.Remaining)/l.Reset.Seconds()), true
		}
	}
	return best, ok
}

// unitsPerSecond is u's rate in units per second.
func unitsPerSecond(u leaky.Units) float64 {
	if u.Per <= 0 {
		return 0
	}
	return float64(u.N) / u.Per.Seconds()
}
