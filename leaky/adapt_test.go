package leaky

import (
	"context"
	"math"
	"testing"
	"time"
)

// TestAdapt is AIMD on the learned rate, the same on both schedules: a push-back halves it once
// however many workers report it within the hold, successes add to it up to the ceiling, a
// quota target lowers it, and it never leaves [floor, ceiling].
func TestAdapt(t *testing.T) {
	forEach(t, func(t *testing.T, s Schedule, c *clock) {
		ctx := context.Background()
		a, ok := s.(Adapter)
		if !ok {
			t.Fatalf("%T is not an Adapter", s)
		}
		base := Adaptation{Ceiling: 50, Floor: 1, Factor: 0.5, Hold: time.Second, Forget: time.Hour}
		step := func(what string, change func(*Adaptation), want float64, wantDec bool) {
			t.Helper()
			ad := base
			change(&ad)
			got, dec, err := a.Adapt(ctx, "q", ad)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(got-want) > 1e-9 || dec != wantDec {
				t.Fatalf("%s: rate %v (decreased %v), want %v (%v)", what, got, dec, want, wantDec)
			}
		}
		if _, ok, err := a.Learned(ctx, "q"); ok || err != nil {
			t.Fatalf("a learned rate before any adaptation (%v)", err)
		}
		step("first look", func(*Adaptation) {}, 50, false)
		step("push-back", func(a *Adaptation) { a.Decrease = true }, 25, true)
		step("another worker's push-back, same moment", func(a *Adaptation) { a.Decrease = true }, 25, false)
		c.Advance(time.Second)
		step("push-back after the hold", func(a *Adaptation) { a.Decrease = true }, 12.5, true)
		step("successes", func(a *Adaptation) { a.Increase = 2.5 }, 15, false)
		if got, ok, err := a.Learned(ctx, "q"); !ok || err != nil || got != 15 {
			t.Fatalf("Learned = %v, %v, %v; want 15", got, ok, err)
		}
		step("more successes", func(a *Adaptation) { a.Increase = 7.5 }, 22.5, false)
		c.Advance(time.Second)
		// 22.5 is within 15% of the last push-back's 25: half as deep, factor (1+0.5)/2.
		step("push-back near the last one", func(a *Adaptation) { a.Decrease = true }, 16.875, true)
		step("quota target", func(a *Adaptation) { a.Target = 4 }, 4, false)
		step("target above the rate is no raise", func(a *Adaptation) { a.Target = 40 }, 4, false)
		for range 10 {
			c.Advance(time.Second)
			if _, _, err := a.Adapt(ctx, "q", Adaptation{Ceiling: 50, Floor: 1, Decrease: true, Factor: 0.5, Forget: time.Hour}); err != nil {
				t.Fatal(err)
			}
		}
		step("at the floor", func(*Adaptation) {}, 1, false)
		step("at the last push-back, successes climb a hundredth as fast", func(a *Adaptation) { a.Increase = 5 }, 1.05, false)
		if _, _, err := a.Adapt(ctx, "q", Adaptation{Ceiling: 50, Floor: 60, Forget: time.Hour}); err == nil {
			t.Fatal("a floor above the ceiling was accepted")
		}
	})
}
