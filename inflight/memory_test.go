package inflight

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// TestMemoryForgetsIdleKeys: a key whose places are released is deleted at once; keys whose
// places all expired are swept as new keys arrive, so memory follows the places held.
func TestMemoryForgetsIdleKeys(t *testing.T) {
	ctx := context.Background()
	m := NewMemory()
	r := ok(t)(m.Acquire(ctx, []Cap{{Key: "a", Limit: 1}, {Key: "b", Limit: 1}}, time.Minute))
	if m.Len() != 2 {
		t.Fatalf("Len %d, want 2", m.Len())
	}
	m.Release(ctx, r.Lease)
	if m.Len() != 0 {
		t.Fatalf("Len %d after the release, want 0", m.Len())
	}
	// A refused Acquire leaves no state for a key it found empty.
	ok(t)(m.Acquire(ctx, []Cap{{Key: "full", Limit: 1}}, time.Minute))
	if r := ok(t)(m.Acquire(ctx, []Cap{{Key: "empty", Limit: 1}, {Key: "full", Limit: 1}}, time.Minute)); r.Acquired || m.Len() != 1 {
		t.Fatalf("refused: %+v, Len %d; want 1", r, m.Len())
	}

	const hold = 20 * time.Millisecond
	for i := range 1000 {
		ok(t)(m.Acquire(ctx, []Cap{{Key: "old" + strconv.Itoa(i), Limit: 1}}, hold))
	}
	start := time.Now()
	testenv.WaitFor(t, 5*time.Second, "the places to expire", func() bool { return time.Since(start) > hold })
	for i := range 1000 {
		ok(t)(m.Acquire(ctx, []Cap{{Key: "new" + strconv.Itoa(i), Limit: 1}}, time.Minute))
	}
	// 1001 keys live ("full" and the new ones); a sweep ran when the keys had doubled.
	if n := m.Len(); n > 1001+minSweep || n < 1001 {
		t.Fatalf("Len %d after the old keys expired; want about 1001", n)
	}
}
