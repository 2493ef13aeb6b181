package limit

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Algorithm names an admission algorithm. The zero value is invalid.
type Algorithm string

// The algorithms. Their names are the values accepted in the config file.
//
// Whether a rejected request consumes quota:
//   - TokenBucket, LeakyBucket, GCRA: no. A rejection leaves the bucket as it was, as nginx
//     limit_req and GCRA do; a client that keeps knocking gets in as soon as capacity returns.
//   - FixedWindow, SlidingWindow: no. Only admitted requests are counted, so a window's count is
//     the number of requests that really reached the upstream.
//   - SlidingLog: no. The book's log also records rejected timestamps, which locks out a client
//     that retries faster than the window for as long as it retries, and makes memory grow with
//     the attack rather than with the limit. Sluice records admitted requests only, so the log of
//     a key never holds more than Limit entries.
const (
	// TokenBucket holds up to Burst tokens (default Limit) and refills Limit tokens per Period,
	// continuously. A request takes cost tokens.
	TokenBucket Algorithm = "token_bucket"
	// LeakyBucket is the leaky bucket as a meter (nginx limit_req): a bucket of capacity Burst
	// (default 1, which spaces requests strictly 1/rate apart) that leaks Limit per Period. A
	// request pours cost units in; if they would overflow, it is rejected.
	LeakyBucket Algorithm = "leaky_bucket"
	// FixedWindow counts requests in windows of Period aligned to the Unix epoch and admits at
	// most Limit per window. Up to 2×Limit can pass around a window boundary.
	FixedWindow Algorithm = "fixed_window"
	// SlidingLog keeps the timestamp of every admitted request and admits a request when fewer
	// than Limit were admitted in the trailing Period. Exact; memory grows with Limit.
	SlidingLog Algorithm = "sliding_log"
	// SlidingWindow approximates a sliding window from two fixed-window counters: the count of
	// the previous window weighted by the share of it still inside the trailing Period, rounded
	// down, plus the current window's count (Cloudflare's algorithm).
	SlidingWindow Algorithm = "sliding_window"
	// GCRA is the generic cell rate algorithm: one theoretical arrival time per key, emission
	// interval Period/Limit, and a tolerance that admits bursts of up to Burst (default Limit).
	GCRA Algorithm = "gcra"
)

// Algorithms lists every algorithm, in the order the documentation presents them.
var Algorithms = []Algorithm{TokenBucket, LeakyBucket, FixedWindow, SlidingLog, SlidingWindow, GCRA}

// Valid reports whether a names a known algorithm.
func (a Algorithm) Valid() bool {
	_, ok := a.index()
	return ok
}

// MaxKeyLen is the longest key a store accepts, in bytes. Callers with longer keys hash them.
const MaxKeyLen = 512

// Errors returned by Validate and by the limiters. They mean "could not decide".
var (
	ErrUnknownAlgorithm = errors.New("limit: unknown algorithm")
	ErrInvalidLimit     = errors.New("limit: limit must be > 0")
	ErrInvalidPeriod    = errors.New("limit: period must be > 0")
	ErrInvalidBurst     = errors.New("limit: burst must be >= 0")
	ErrInvalidCost      = errors.New("limit: cost must be > 0")
	ErrCostTooHigh      = errors.New("limit: cost exceeds capacity")
	ErrEmptyKey         = errors.New("limit: empty key")
	ErrKeyTooLong       = errors.New("limit: key too long")
	// ErrNotAdmitted is returned by Adjust for a decision that charged nothing.
	ErrNotAdmitted = errors.New("limit: decision did not admit")
	// ErrDebtCapped is returned by Adjust when the key would owe more than DebtCapacities
	// capacities: the charge was recorded up to that cap and the rest dropped. It is a report,
	// not a failure (callers count it); SlidingLog, which carries no debt, returns it for any
	// extra charge that does not fit its log.
	ErrDebtCapped = errors.New("limit: debt capped")
	// ErrChargeMade is returned by Adjust when the extra charge of a Decision's ChargeID was
	// made already, by an earlier call (perhaps one whose reply was lost or timed out after
	// the store ran it): nothing was changed. Like ErrDebtCapped it is a report, not a
	// failure: the charge stands, once.
	ErrChargeMade = errors.New("limit: charge already made")
	// ErrOutOfRange means a limit is valid in principle but beyond what the stores compute
	// exactly: a period that is not a whole number of microseconds, or a capacity × period
	// product too large for integer arithmetic on Lua's doubles (see [Limit.Validate]).
	ErrOutOfRange = errors.New("limit: out of range")
	// ErrInvalidReset means OnReset names no ResetMode.
	ErrInvalidReset = errors.New("limit: on reset must be allow or hold")
)

// Limit is one rate limit: Limit requests per Period, decided by Algorithm. Burst is the bucket
// capacity for TokenBucket, LeakyBucket and GCRA (0 means the algorithm's default) and is
// ignored by the window algorithms. Period must be a whole number of microseconds. A Limit is a
// small value, compared and copied freely; its zero value is invalid.
//
// TokenBucket, LeakyBucket and GCRA of equal capacity make the same decisions: they are three
// bookkeepings (tokens left, level poured, theoretical arrival time) of one rule. They differ in
// their default capacity — Limit for the token bucket and GCRA, 1 for the leaky bucket.
//
// OnReset is what the limit admits after the Redis store learned that Redis lost its state
// (see [ResetMode]; "" is ResetFresh). Memory ignores it: its state lives as long as the process.
type Limit struct {
	Algorithm Algorithm
	Limit     int64
	Period    time.Duration
	Burst     int64
	OnReset   ResetMode
	// Refunds says the limit's charges are reconciled with Adjust (a rule with
	// cost_from_response): a TokenBucket then keeps the record of its levels before each charge
	// that makes a refund exact (peaks.go). Without it a TokenBucket's refund gives back at most
	// the charge less what the rate refilled since, and its state costs less (no record). Other
	// algorithms ignore it.
	Refunds bool
}

// Validate reports why l cannot be used, or nil. The error wraps one or more of
// ErrUnknownAlgorithm, ErrInvalidLimit, ErrInvalidPeriod, ErrInvalidBurst and ErrOutOfRange.
//
// Both stores compute in integer microseconds, and the Redis store does so in Lua, whose numbers
// are doubles, exact up to 2^53. So Period must be a whole number of microseconds, and the
// products the algorithms form must stay exact: for TokenBucket, LeakyBucket and GCRA,
// Capacity() × Period(µs) / gcd(Limit, Period(µs)) at most 2^52; for SlidingWindow,
// Limit × Period(µs) at most 2^53; Limit, Burst and Period(µs) at most 2^52 for all. Every
// everyday limit is far inside these bounds (100 000 per day is 8.64e10 for a bucket and 8.64e15
// for a sliding window); ErrOutOfRange reports the ones that are not.
func (l Limit) Validate() error {
	_, err := l.validate()
	return err
}

// validate is Validate that also returns the limit in the form the algorithms compute with.
func (l Limit) validate() (params, error) {
	alg, known := l.Algorithm.index()
	if known && l.Limit > 0 && l.Period > 0 && l.Burst >= 0 && l.OnReset.Valid() {
		return l.params(alg) // the hot path: no error to build
	}
	var errs []error
	if !known {
		errs = append(errs, fmt.Errorf("%w %q", ErrUnknownAlgorithm, string(l.Algorithm)))
	}
	if l.Limit <= 0 {
		errs = append(errs, ErrInvalidLimit)
	}
	if l.Period <= 0 {
		errs = append(errs, ErrInvalidPeriod)
	}
	if l.Burst < 0 {
		errs = append(errs, ErrInvalidBurst)
	}
	if !l.OnReset.Valid() {
		errs = append(errs, fmt.Errorf("%w: %q", ErrInvalidReset, string(l.OnReset)))
	}
	return params{}, errors.Join(errs...)
}

// Capacity is the largest cost a single request may have under l: the bucket size for the
// bucket algorithms and GCRA, Limit for the window algorithms.
func (l Limit) Capacity() int64 {
	switch l.Algorithm {
	case TokenBucket, GCRA:
		if l.Burst > 0 {
			return l.Burst
		}
		return l.Limit
	case LeakyBucket:
		if l.Burst > 0 {
			return l.Burst
		}
		return 1
	default:
		return l.Limit
	}
}

// Decision is the answer to one request: whether it is admitted, and everything a 429 and the
// rate-limit headers need.
type Decision struct {
	// Allowed reports whether the request was admitted (and charged).
	Allowed bool
	// Limit is the quota of the policy: Limit requests per Period.
	Limit int64
	// Remaining is how many more requests of cost 1 would be admitted right now, >= 0.
	Remaining int64
	// ResetAfter is how long until the quota is whole again, >= 0: a full token bucket, an
	// empty leaky bucket, a TAT in the past, the end of the fixed window, or nothing left in
	// the sliding log or the sliding window's estimate. Microsecond resolution.
	ResetAfter time.Duration
	// RetryAfter is how long until this request (of the same cost) would be admitted, if
	// nothing else is charged meanwhile; 0 when Allowed. Microsecond resolution.
	RetryAfter time.Duration
	// At is the store's instant of the decision, in UTC at microsecond resolution: the
	// store's clock (Redis: the server's TIME), or the key's last instant if that clock
	// reads earlier. Adjust finds the charge by it.
	At time.Time
	// Cost is what the decision charged: the request's cost when Allowed, else 0.
	Cost int64
	// ChargeID, when not 0, names the extra charge an Adjust of this decision makes, so that
	// the charge is made at most once however often it is asked: a caller that makes again a
	// charge whose Adjust failed (its reply lost or timed out, while the store may have run
	// it, or may still run it when a stalled server resumes) sets a ChargeID before the first
	// call and keeps it. The store records the IDs of the charges it made, for
	// [ChargeMarkTTL] and at most [MaxChargeMarks] a key (Memory: 65 536 a store), and answers a
	// recorded one with ErrChargeMade. Decide leaves it 0: an Adjust without one is not
	// recorded, and refunds never are. Callers pick IDs at random (64 bits).
	ChargeID uint64
}

// How long, and how many, charge IDs a store records (Decision.ChargeID): a charge made again
// within ChargeMarkTTL of the first, among the latest MaxChargeMarks charges with an ID of its
// key, is made once. The Redis store keeps them in a sorted set beside the key's state (the
// state's key + ":c", in its hash slot), about 30 bytes each, so a key that takes more than
// MaxChargeMarks extra charges in ChargeMarkTTL keeps them for less; Memory keeps about the
// latest 65 536 a store (1 MiB, taken on first use). lua/lib.lua holds the same two numbers.
const (
	ChargeMarkTTL  = 5 * time.Minute
	MaxChargeMarks = 8192
)

// Request is one decision asked of DecideAll: Cost units charged against Key under Limit.
type Request struct {
	Key   string
	Limit Limit
	Cost  int64
}

// Limiter decides requests against limits. Implementations are safe for concurrent use.
type Limiter interface {
	// Decide charges cost against key under l and reports the decision. It returns an error
	// wrapping one of the package's sentinel errors for bad input, or the store's error when
	// it could not decide; a rejection is a Decision, not an error.
	Decide(ctx context.Context, key string, l Limit, cost int64) (Decision, error)
	// DecideAll decides several requests at once, each charged independently, in one round
	// trip to the store. The decisions are in the order of reqs.
	DecideAll(ctx context.Context, reqs []Request) ([]Decision, error)
	// Adjust reconciles an admitted request with what it really used: d is the Decision that
	// admitted it against key under l (d.Cost charged at d.At), used its true cost in the
	// same units. It charges used-d.Cost more when used is higher, and refunds d.Cost-used
	// when it is lower, within the limits the package doc states; used == d.Cost does
	// nothing. Each decision is to be adjusted at most once. It returns an error wrapping
	// ErrNotAdmitted or ErrInvalidCost (used < 0) or a sentinel error of Decide for bad
	// input, ErrDebtCapped when the charge was recorded only up to the debt cap (in full
	// otherwise), or the store's error when it could not adjust.
	Adjust(ctx context.Context, key string, l Limit, d Decision, used int64) error
}

// check validates one request before any store is touched, and returns the limit in the
// integer form the algorithms compute with.
func check(key string, l Limit, cost int64) (params, error) {
	p, err := l.cachedParams()
	if err != nil {
		return params{}, err
	}
	switch {
	case key == "":
		return params{}, ErrEmptyKey
	case len(key) > MaxKeyLen:
		return params{}, fmt.Errorf("%w: %d bytes, at most %d", ErrKeyTooLong, len(key), MaxKeyLen)
	case cost <= 0:
		return params{}, ErrInvalidCost
	case cost > p.capacity:
		return params{}, fmt.Errorf("%w: cost %d, capacity %d", ErrCostTooHigh, cost, p.capacity)
	}
	return p, nil
}

// checkAdjust validates an Adjust before any store is touched. It returns the limit in integer
// form and the units to charge (> 0) or refund (< 0), the charge bounded to DebtCapacities+2
// capacities (more can never be recorded, and the store still sees that it was more than it
// can: see the package doc).
func checkAdjust(key string, l Limit, d Decision, used int64) (params, int64, error) {
	p, err := check(key, l, max(1, d.Cost))
	switch {
	case err != nil:
		return params{}, 0, err
	case !d.Allowed || d.Cost <= 0:
		return params{}, 0, ErrNotAdmitted
	case used < 0:
		return params{}, 0, fmt.Errorf("%w: used %d", ErrInvalidCost, used)
	}
	return p, min(used-d.Cost, (DebtCapacities+2)*p.capacity), nil
}
