package leaky_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-rl/sluice/leaky"
)

// Takes at one instant: the first slot plus one burst slot are free, the rest are spaced by the
// interval. A pause moves the schedule for every worker.
func ExampleMemory() {
	ctx := context.Background()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s := leaky.NewMemory(func() time.Time { return now })
	r := leaky.Rate{Interval: 100 * time.Millisecond, Burst: 1} // 10/s, burst 1
	for range 4 {
		slot, _ := s.Take(ctx, "orders", r)
		fmt.Println(slot.Wait)
	}
	_ = s.Pause(ctx, "orders", 2*time.Second) // the upstream said Retry-After: 2
	slot, _ := s.Take(ctx, "orders", r)
	fmt.Println(slot.Wait)
	// Output:
	// 0s
	// 0s
	// 100ms
	// 200ms
	// 2s
}

// A worker's drain loop: Wait returns when the next delivery may go.
func ExampleWait() {
	ctx := context.Background()
	s := leaky.NewMemory(nil)
	r := leaky.Every(100, time.Second)
	start := time.Now()
	for range 3 {
		if err := leaky.Wait(ctx, s, "orders", r, nil); err != nil {
			return
		}
		// deliver…
	}
	fmt.Println(time.Since(start) >= 20*time.Millisecond)
	// Output: true
}
