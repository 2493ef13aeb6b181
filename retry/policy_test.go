package retry_test

import (
	"math"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/sluice-rl/sluice/retry"
	"github.com/sluice-rl/sluice/retry/retrytest"
)

var t0 = time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC)

func TestPolicyZeroValueDefaults(t *testing.T) {
	var p retry.Policy
	// rnd = 0.5 is the centre of the jitter range, so Delay returns the base delay.
	want := []time.Duration{
		500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second,
		8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second,
	}
	for i, w := range want {
		if got := p.Delay(i+1, 0.5); got != w {
			t.Errorf("Delay(%d, 0.5) = %v, want %v", i+1, got, w)
		}
	}
	// Default jitter is 0.5: the range for attempt 1 is [250ms, 750ms].
	if got := p.Delay(1, 0); got != 250*time.Millisecond {
		t.Errorf("Delay(1, 0) = %v, want 250ms", got)
	}
	if got := p.Delay(1, 0.999999); got < 749*time.Millisecond || got > 750*time.Millisecond {
		t.Errorf("Delay(1, ~1) = %v, want about 750ms", got)
	}
}

func TestPolicyDelayWithinJitterRange(t *testing.T) {
	p := retry.Policy{Initial: 100 * time.Millisecond, Max: 2 * time.Second, Multiplier: 3, Jitter: 0.25}
	// Base delays written out by hand: 100ms * 3^(n-1), capped at 2s.
	bases := []time.Duration{
		100 * time.Millisecond, 300 * time.Millisecond, 900 * time.Millisecond,
		2 * time.Second, 2 * time.Second, 2 * time.Second,
	}
	extremes := []float64{0, math.SmallestNonzeroFloat64, 0.5, math.Nextafter(1, 0)}
	prevMean := time.Duration(0)
	for i, base := range bases {
		attempt := i + 1
		lo := time.Duration(float64(base) * 0.75)
		hi := time.Duration(float64(base) * 1.25)
		inRange := func(rnd float64) time.Duration {
			d := p.Delay(attempt, rnd)
			if d < lo || d > hi {
				t.Fatalf("Delay(%d, %v) = %v, outside [%v, %v]", attempt, rnd, d, lo, hi)
			}
			return d
		}
		for _, rnd := range extremes {
			inRange(rnd)
		}
		const n = 1000
		var sum float64
		for k := 0; k < n; k++ {
			sum += float64(inRange((float64(k) + 0.5) / n))
		}
		mean := time.Duration(sum / float64(n))
		// The mean over a uniform grid of rnd is the base delay (within grid error) and
		// never decreases from one attempt to the next.
		if diff := math.Abs(float64(mean-base)) / float64(base); diff > 0.01 {
			t.Errorf("attempt %d: mean delay %v, want about %v", attempt, mean, base)
		}
		if mean < prevMean {
			t.Errorf("attempt %d: mean delay %v decreased from %v", attempt, mean, prevMean)
		}
		prevMean = mean
	}
}

func TestPolicyDelayCappedWithoutOverflow(t *testing.T) {
	p := retry.Policy{Initial: time.Second, Max: time.Minute, Jitter: -1}
	for _, attempt := range []int{7, 100, 10_000, math.MaxInt} {
		if got := p.Delay(attempt, 0.3); got != time.Minute {
			t.Errorf("Delay(%d) = %v, want the cap 1m", attempt, got)
		}
	}
	huge := retry.Policy{Initial: time.Hour, Max: math.MaxInt64, Multiplier: 1e6, Jitter: 1}
	if got := huge.Delay(50, 0.99); got != math.MaxInt64 {
		t.Errorf("Delay = %v, want saturation at the largest Duration", got)
	}
}

func TestPolicyDelayEdgeInputs(t *testing.T) {
	p := retry.Policy{Initial: time.Second, Max: time.Minute, Jitter: 0.5}
	tests := []struct {
		name    string
		attempt int
		rnd     float64
		want    time.Duration
	}{
		{"attempt 0 counts as 1", 0, 0.5, time.Second},
		{"negative attempt counts as 1", -3, 0.5, time.Second},
		{"rnd below 0 clamps to the low end", 1, -7, 500 * time.Millisecond},
		{"NaN rnd clamps to the low end", 1, math.NaN(), 500 * time.Millisecond},
	}
	for _, tt := range tests {
		if got := p.Delay(tt.attempt, tt.rnd); got != tt.want {
			t.Errorf("%s: Delay(%d, %v) = %v, want %v", tt.name, tt.attempt, tt.rnd, got, tt.want)
		}
	}
	if got := p.Delay(1, 5); got > 1500*time.Millisecond || got < 1499*time.Millisecond {
		t.Errorf("rnd above 1: Delay = %v, want the top of the range, 1.5s", got)
	}

	noJitter := retry.Policy{Initial: time.Second, Jitter: -1}
	for _, rnd := range []float64{0, 0.3, 0.999} {
		if got := noJitter.Delay(2, rnd); got != 2*time.Second {
			t.Errorf("negative Jitter: Delay(2, %v) = %v, want exactly 2s", rnd, got)
		}
	}
	fullJitter := retry.Policy{Initial: time.Second, Jitter: 7}
	if got := fullJitter.Delay(1, 0); got != 0 {
		t.Errorf("Jitter above 1 is 1: Delay(1, 0) = %v, want 0", got)
	}
	constant := retry.Policy{Initial: time.Second, Multiplier: 1, Jitter: -1}
	if got := constant.Delay(9, 0); got != time.Second {
		t.Errorf("Multiplier 1: Delay(9) = %v, want 1s", got)
	}
}

func TestPolicyNewBackOffMatchesDelay(t *testing.T) {
	p := retry.Policy{Initial: 100 * time.Millisecond, Max: 3 * time.Second, Jitter: -1}
	b := p.NewBackOff()
	for attempt := 1; attempt <= 10; attempt++ {
		if got, want := b.NextBackOff(), p.Delay(attempt, 0); got != want {
			t.Fatalf("NextBackOff #%d = %v, Delay = %v", attempt, got, want)
		}
	}

	jittered := retry.Policy{Initial: time.Second, Max: 4 * time.Second}.NewBackOff()
	for attempt, base := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second} {
		got := jittered.NextBackOff()
		if got < base/2 || got > base*3/2 {
			t.Errorf("jittered NextBackOff #%d = %v, outside [%v, %v]", attempt+1, got, base/2, base*3/2)
		}
	}
}

func TestPolicyNewBackOffMaxAttempts(t *testing.T) {
	b := retry.Policy{Initial: time.Second, MaxAttempts: 3, Jitter: -1}.NewBackOff()
	// Three attempts means two waits between them.
	for i, want := range []time.Duration{time.Second, 2 * time.Second, backoff.Stop} {
		if got := b.NextBackOff(); got != want {
			t.Errorf("NextBackOff #%d = %v, want %v", i+1, got, want)
		}
	}
	once := retry.Policy{MaxAttempts: 1}.NewBackOff()
	if got := once.NextBackOff(); got != backoff.Stop {
		t.Errorf("MaxAttempts 1: NextBackOff = %v, want Stop", got)
	}
}

func TestPolicyNewBackOffMaxElapsed(t *testing.T) {
	clock := retrytest.NewClock(t0)
	b := retry.Policy{Initial: time.Second, Jitter: -1, MaxElapsed: 5 * time.Second}.NewBackOffClock(clock)
	if got := b.NextBackOff(); got != time.Second {
		t.Fatalf("first = %v, want 1s", got)
	}
	clock.Advance(time.Second)
	if got := b.NextBackOff(); got != 2*time.Second { // ends at 3s <= 5s
		t.Fatalf("second = %v, want 2s", got)
	}
	clock.Advance(2 * time.Second)
	if got := b.NextBackOff(); got != backoff.Stop { // would end at 7s > 5s
		t.Fatalf("third = %v, want Stop", got)
	}
}
