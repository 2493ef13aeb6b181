package limit

import "time"

// The step tables of the token bucket's exact refund (peaks.go), run against every store with
// the other conformance cases. Each was worked out by hand as the bucket that had charged the
// true cost in the first place: a refund gives back the difference, less what that bucket
// would have lost to its capacity since.
func init() {
	tb := Limit{Algorithm: TokenBucket, Limit: 10, Period: 10 * time.Second}
	conformanceCases = append(conformanceCases, []struct {
		name  string
		limit Limit
		steps []step
	}{
		{
			// Charged 0 first, the bucket would have held 10, 6 at 5 s (4 charged), 7 at 6 s:
			// 3 more than the 4 it holds, where "what has not refilled" (8 - 6) says 2.
			name:  "token_bucket/refund: what the bucket would hold had the charge been less",
			limit: tb,
			steps: []step{
				{at: 0, cost: 8, want: ok(2, 8*time.Second)},
				{at: 5 * time.Second, cost: 4, want: ok(3, 7*time.Second)},
				fix(6*time.Second, 0, 0),
				{at: 6 * time.Second, cost: 8, want: no(7, 3*time.Second, time.Second)},
				{at: 6 * time.Second, cost: 7, want: ok(0, 10*time.Second)},
			},
		},
		{
			// A refund long after its charge (14 s, 1.4 periods): charged 0, the bucket would
			// have held 10, then 4 after each of the charges at 4, 8 and 12 s, and 6 now: 4 more
			// than now. What has not refilled since (8 - 14) is nothing.
			name:  "token_bucket/refund: a charge long ago, the bucket never full since",
			limit: tb,
			steps: []step{
				{at: 0, cost: 8, want: ok(2, 8*time.Second)},
				{at: 4 * time.Second, cost: 6, want: ok(0, 10*time.Second)},
				{at: 8 * time.Second, cost: 4, want: ok(0, 10*time.Second)},
				{at: 12 * time.Second, cost: 4, want: ok(0, 10*time.Second)},
				fix(14*time.Second, 0, 0),
				{at: 14 * time.Second, cost: 7, want: no(6, 4*time.Second, time.Second)},
				{at: 14 * time.Second, cost: 6, want: ok(0, 10*time.Second)},
			},
		},
		{
			// The bucket was full at 6 s, after the charge: a smaller charge would have been
			// lost to the capacity then, so nothing comes back.
			name:  "token_bucket/refund: nothing once the bucket has been full since",
			limit: tb,
			steps: []step{
				{at: 0, cost: 5, want: ok(5, 5*time.Second)},
				{at: 6 * time.Second, cost: 10, want: ok(0, 10*time.Second)},
				fix(6*time.Second, 0, 0),
				{at: 6 * time.Second, cost: 1, want: no(0, 10*time.Second, time.Second)},
			},
		},
		{
			// Two refunds, the older charge first. Charged 0 at 0, the bucket would have held 10,
			// 9 at 1 s, 10 from 2 s, 5 at 5 s: 1 more than the 4 it holds. Charged 0 at 1 s
			// too, it would hold the same 5: the second refund gives nothing, although the
			// levels the bucket really had (6 at 1 s, 9 at 5 s) never reached 10.
			name:  "token_bucket/refund: a second refund counts the first",
			limit: tb,
			steps: []step{
				{at: 0, cost: 5, want: ok(5, 5*time.Second)},
				{at: time.Second, cost: 1, want: ok(5, 5*time.Second)},
				{at: 5 * time.Second, cost: 5, want: ok(4, 6*time.Second)},
				fix(5*time.Second, 0, 0),
				fix(5*time.Second, 1, 0),
				{at: 5 * time.Second, cost: 6, want: no(5, 5*time.Second, time.Second)},
				{at: 5 * time.Second, cost: 5, want: ok(0, 10*time.Second)},
			},
		},
	}...)
}
