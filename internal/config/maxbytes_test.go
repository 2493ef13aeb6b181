package config

import (
	"strings"
	"testing"
)

// TestMaxBytes checks a queue's max_bytes: its default, a value of the file's, and that it
// cannot be below max_body_bytes (no job would fit).
func TestMaxBytes(t *testing.T) {
	c, err := Parse("t.yaml", []byte("queues:\n  - {name: a, rate: 1/s, max_bytes: 2097152}\n  - {name: b, rate: 1/s}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Queues[0].MaxBytes != 2<<20 || c.Queues[1].MaxBytes != DefaultMaxBytes {
		t.Fatalf("max_bytes %d and %d, want %d and the default %d", c.Queues[0].MaxBytes, c.Queues[1].MaxBytes, 2<<20, DefaultMaxBytes)
	}
	_, err = Parse("t.yaml", []byte("queues:\n  - {name: a, rate: 1/s, max_bytes: 1000}\n"), nil)
	if err == nil || !strings.Contains(err.Error(), `queues[0] "a": max_bytes must be between 1048576`) {
		t.Fatalf("max_bytes below max_body_bytes: %v", err)
	}
}
