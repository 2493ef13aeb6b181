package retry_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/sluice-rl/sluice/retry"
)

// A Policy drives cenkalti/backoff's Retry: here, an operation that fails twice with a
// transient error is tried three times, with jittered exponential waits between the tries,
// and the loop stops after MaxAttempts in any case.
func ExamplePolicy_NewBackOff() {
	p := retry.Policy{Initial: time.Millisecond, Max: 10 * time.Millisecond, MaxAttempts: 5}
	tries := 0
	err := backoff.Retry(func() error {
		tries++
		if tries < 3 {
			return errors.New("upstream unavailable")
		}
		return nil
	}, p.NewBackOff())
	fmt.Println(tries, err)
	// Output: 3 <nil>
}
