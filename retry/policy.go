// Package retry decides whether, and after how long, an HTTP call is tried again.
//
// It is shared by the two sides of Sluice: the workers classify upstream responses with it
// (ack, nak with delay, pause the queue, dead-letter), and the public client SDK uses it to
// honour the ingress's 429 and 503 responses. It holds five small pieces:
//
//   - [Policy]: exponential backoff with jitter, as a pure function of the attempt number
//     ([Policy.Delay]), as a [Backoff] for one retry loop whose waits never go below the
//     server's Retry-After ([Policy.Backoff]), or as a cenkalti [backoff.BackOff]
//     ([Policy.NewBackOff]);
//   - [ParseRetryAfter] and [FromHeaders]: the server's own wait, read from Retry-After,
//     the IETF RateLimit field (draft-ietf-httpapi-ratelimit-headers-11) or X-RateLimit-Reset;
//     [ParseRateLimit], [ParseRateLimitPolicy] and [Units] read those fields whole;
//   - [Classify]: a response or transport error mapped to [Success], [Retry], [Pause] or
//     [Permanent];
//   - [Clock] and [Sleep]: waiting that honours a context and can be driven by a fake clock
//     in tests (see package retrytest);
//   - [IsToken] and [IsTokenChar]: the HTTP token grammar (RFC 9110), shared by the parsers.
//
// The package imports only the standard library and github.com/cenkalti/backoff/v4, so it can
// be used by clients without pulling in any server dependency.
package retry

import (
	"math"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Defaults used for the zero fields of a [Policy].
const (
	DefaultInitial    = 500 * time.Millisecond
	DefaultMax        = 30 * time.Second
	DefaultMultiplier = 2.0
	DefaultJitter     = 0.5
)

// Policy describes exponential backoff with jitter. The zero value is usable: every zero field
// means its documented default, so Policy{} retries forever with delays of 0.5s, 1s, 2s, …
// capped at 30s, each randomised by ±50%.
//
// A Policy is a plain value; it is safe to copy and to use from several goroutines.
type Policy struct {
	// Initial is the base delay after the first failed attempt. Zero means DefaultInitial (500ms).
	Initial time.Duration
	// Max caps the base delay (before jitter, so a jittered delay may reach Max*(1+Jitter)).
	// Zero means DefaultMax (30s); a Max below Initial means Initial.
	Max time.Duration
	// Multiplier is the growth factor of the base delay per attempt; 1 gives a constant delay.
	// Zero (and any value below 1) means DefaultMultiplier (2).
	Multiplier float64
	// Jitter is the randomisation factor j: a base delay d becomes a value in [d*(1-j), d*(1+j)].
	// Zero means DefaultJitter (0.5); a negative value disables jitter; values above 1 are
	// treated as 1.
	Jitter float64
	// MaxElapsed bounds the total time spent retrying: no wait is started that would end past
	// it. Zero means unbounded.
	MaxElapsed time.Duration
	// MaxAttempts bounds the number of attempts, the first one included (MaxAttempts 1 means
	// never retry). Zero means unbounded.
	MaxAttempts int
}

func (p Policy) initial() time.Duration {
	if p.Initial <= 0 {
		return DefaultInitial
	}
	return p.Initial
}

func (p Policy) max() time.Duration {
	if p.Max <= 0 {
		return DefaultMax
	}
	return max(p.Max, p.initial())
}

func (p Policy) multiplier() float64 {
	if p.Multiplier < 1 || math.IsNaN(p.Multiplier) || math.IsInf(p.Multiplier, 0) {
		return DefaultMultiplier
	}
	return p.Multiplier
}

func (p Policy) jitter() float64 {
	switch {
	case p.Jitter == 0 || math.IsNaN(p.Jitter):
		return DefaultJitter
	case p.Jitter < 0:
		return 0
	case p.Jitter > 1:
		return 1
	}
	return p.Jitter
}

// NewBackOff returns a fresh exponential backoff for p, measuring MaxElapsed on the system
// clock. It returns backoff.Stop once MaxAttempts attempts have been made or the next wait
// would end past MaxElapsed. Like every backoff.BackOff it is not safe for concurrent use.
func (p Policy) NewBackOff() backoff.BackOff {
	return p.NewBackOffClock(SystemClock)
}

// NewBackOffClock is [Policy.NewBackOff] with MaxElapsed measured on c (a nil c means
// SystemClock).
func (p Policy) NewBackOffClock(c Clock) backoff.BackOff {
	if c == nil {
		c = SystemClock
	}
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(p.initial()),
		backoff.WithMaxInterval(p.max()),
		backoff.WithMultiplier(p.multiplier()),
		backoff.WithRandomizationFactor(p.jitter()),
		backoff.WithMaxElapsedTime(max(p.MaxElapsed, 0)),
		backoff.WithClockProvider(c),
	)
	if p.MaxAttempts > 0 {
		return backoff.WithMaxRetries(b, uint64(p.MaxAttempts-1))
	}
	return b
}

// Delay is the wait after failed attempt number attempt (1-based), computed without state:
// the base delay Initial*Multiplier^(attempt-1), capped at Max, then spread by the jitter
// factor j to d*(1-j) + rnd*2*j*d, which lies in [d*(1-j), d*(1+j)]. rnd is a uniform random
// number in [0, 1) supplied by the caller (values outside are clamped), so the result is
// reproducible. It is the same sequence NewBackOff produces, which lets a worker compute the
// NakWithDelay of a redelivered message from its delivery count alone.
//
// Delay ignores MaxAttempts and MaxElapsed; attempts below 1 count as 1.
func (p Policy) Delay(attempt int, rnd float64) time.Duration {
	attempt = max(attempt, 1)
	initial, ceiling := float64(p.initial()), float64(p.max())
	d := initial * math.Pow(p.multiplier(), float64(attempt-1))
	if d > ceiling || math.IsInf(d, 0) || math.IsNaN(d) {
		d = ceiling
	}
	switch {
	case rnd < 0 || math.IsNaN(rnd):
		rnd = 0
	case rnd >= 1:
		rnd = math.Nextafter(1, 0)
	}
	j := p.jitter()
	out := d*(1-j) + rnd*2*j*d
	if out >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(out)
}
