package regions

import (
	"math"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/limit"
)

// TestCut: a region's part of a global rule's limit is rounded down (the parts of all regions
// never sum above the limit, and an exact half is an exact half), a burst keeps at least 1, and
// a part below one request per period admits nothing.
func TestCut(t *testing.T) {
	gcra := limit.Limit{Algorithm: limit.GCRA, Limit: 1000, Period: time.Minute, Burst: 50}
	for _, tc := range []struct {
		name  string
		f     float64
		limit int64
		burst int64
		ok    bool
	}{
		{"whole", 1, 1000, 50, true},
		{"above whole", 1.5, 1000, 50, true},
		{"NaN is whole", math.NaN(), 1000, 50, true},
		{"half of a per-second budget", (1000.0 / 60 / 2) / (1000.0 / 60), 500, 25, true},
		{"a third", 1.0 / 3, 333, 16, true},
		{"burst at least 1", 0.01, 10, 1, true},
		{"below one per period", 0.0009, 0, 1, false},
		{"zero", 0, 0, 1, false},
		{"negative", -1, 0, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Cut(gcra, tc.f)
			if got.Limit != tc.limit || got.Burst != tc.burst || ok != tc.ok {
				t.Errorf("Cut(%v) = limit %d burst %d ok %v; want %d %d %v", tc.f, got.Limit, got.Burst, ok, tc.limit, tc.burst, tc.ok)
			}
			if got.Period != gcra.Period || got.Algorithm != gcra.Algorithm {
				t.Errorf("Cut changed the period or algorithm: %+v", got)
			}
		})
	}
	// Three regions' parts of an awkward limit never sum above it.
	seven := limit.Limit{Algorithm: limit.FixedWindow, Limit: 7, Period: time.Second}
	sum := int64(0)
	for _, f := range []float64{0.4, 0.35, 0.25} {
		c, _ := Cut(seven, f)
		sum += c.Limit
	}
	if sum > 7 {
		t.Errorf("parts sum to %d > 7", sum)
	}
}
