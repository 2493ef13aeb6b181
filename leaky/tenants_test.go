package leaky

import (
	"context"
	"maps"
	"testing"
	"time"
)

// TestTenantPauses: a tenant's pause lasts its d on the store's clock, is never shortened, does
// not touch the queue's schedule or another queue, and is forgotten once it has ended.
func TestTenantPauses(t *testing.T) {
	forEach(t, func(t *testing.T, s Schedule, c *clock) {
		ctx := context.Background()
		tp, ok := s.(TenantPauses)
		if !ok {
			t.Fatalf("%T does not pause tenants", s)
		}
		got, err := tp.PauseTenant(ctx, "q", "a", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[string]time.Duration{"a": 5 * time.Second}; !maps.Equal(got, want) {
			t.Fatalf("after pausing a: %v, want %v", got, want)
		}
		c.Advance(time.Second)
		// A shorter pause leaves the longer one; another tenant joins.
		got, _ = tp.PauseTenant(ctx, "q", "a", time.Second)
		if got["a"] != 4*time.Second {
			t.Fatalf("a paused for %v after a shorter pause, want 4s", got["a"])
		}
		got, _ = tp.PauseTenant(ctx, "q", "b", 10*time.Second)
		if want := map[string]time.Duration{"a": 4 * time.Second, "b": 10 * time.Second}; !maps.Equal(got, want) {
			t.Fatalf("after pausing b: %v, want %v", got, want)
		}
		// The queue itself is not paused, nor is another queue's tenant.
		if p, _ := s.PausedFor(ctx, "q"); p != 0 {
			t.Fatalf("queue paused for %v by a tenant's pause", p)
		}
		if w := take(t, s, "q", perSecond10); w != 0 {
			t.Fatalf("a slot waits %v while only tenants are paused", w)
		}
		if other, _ := tp.PausedTenants(ctx, "other"); len(other) != 0 {
			t.Fatalf("another queue's tenants paused: %v", other)
		}
		// A microsecond before a's pause ends it is still paused; at its end it is gone.
		c.Advance(4*time.Second - time.Microsecond)
		if got, _ = tp.PausedTenants(ctx, "q"); got["a"] != time.Microsecond {
			t.Fatalf("a paused for %v a microsecond before its end", got["a"])
		}
		c.Advance(time.Microsecond)
		got, _ = tp.PausedTenants(ctx, "q")
		if _, still := got["a"]; still || got["b"] != 6*time.Second {
			t.Fatalf("at a's end: %v, want b alone for 6s", got)
		}
		// A non-positive d only reads.
		got, _ = tp.PauseTenant(ctx, "q", "c", 0)
		if _, paused := got["c"]; paused {
			t.Fatalf("PauseTenant(c, 0) paused c: %v", got)
		}
		c.Advance(6 * time.Second)
		if got, _ = tp.PausedTenants(ctx, "q"); len(got) != 0 {
			t.Fatalf("tenants paused after every pause ended: %v", got)
		}
	})
}
