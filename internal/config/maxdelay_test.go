package config

import (
	"strings"
	"testing"
	"time"
)

// TestMaxDelay checks a queue's max_delay: its default (30 days), a value of the file's, and
// that it is positive and at most 366 days.
func TestMaxDelay(t *testing.T) {
	c, err := Parse("t.yaml", []byte("queues:\n  - {name: a, rate: 1/s, max_delay: 1h}\n  - {name: b, rate: 1/s}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Queues[0].MaxDelay != time.Hour || c.Queues[1].MaxDelay != 30*24*time.Hour {
		t.Fatalf("max_delay %v and %v, want 1h and the default 720h", c.Queues[0].MaxDelay, c.Queues[1].MaxDelay)
	}
	for _, bad := range []string{"0s", "-1h", "9000h", "soon"} {
		_, err := Parse("t.yaml", []byte("queues:\n  - {name: a, rate: 1/s, max_delay: "+bad+"}\n"), nil)
		if err == nil || !strings.Contains(err.Error(), `queues[0] "a": max_delay`) {
			t.Errorf("max_delay %s: %v, want an error naming the field", bad, err)
		}
	}
}
