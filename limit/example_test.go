package limit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-rl/sluice/limit"
)

// A sliding log of two requests per minute: the third request within the minute is rejected,
// and the decision says when to retry.
func ExampleMemory() {
	m := limit.NewMemory(limit.MemoryConfig{})
	l := limit.Limit{Algorithm: limit.SlidingLog, Limit: 2, Period: time.Minute}
	for range 3 {
		d, err := m.Decide(context.Background(), "login:alice", l, 1)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(d.Allowed, d.Remaining, d.RetryAfter > 0)
	}
	// Output:
	// true 1 false
	// true 0 false
	// false 0 true
}
