package config

import (
	"strings"
	"testing"
)

// TestMaxBytes checks a queue's max_bytes: its default (none: nothing reserved on the NATS
// server's store), a value of the file's, and that it cannot be below max_body_bytes (no job
// would fit).
func TestMaxBytes(t *testing.T) {
	c, err := Parse("t.yaml", []byte("queues:\n  - {name: a, rate: 1/s, max_bytes: 2097152}\n  - {name: b, rate: 1/s}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Queues[0].MaxBytes != 2<<20 || c.Queues[1].MaxBytes != DefaultMaxBytes || DefaultMaxBytes != 0 {
		t.Fatalf("max_bytes %d and %d, want %d and the default 0", c.Queues[0].MaxBytes, c.Queues[1].MaxBytes, 2<<20)
	}
	_, err = Parse("t.yaml", []byte("queues:\n  - {name: a, rate: 1/s, max_bytes: 1000}\n"), nil)
	if err == nil || !strings.Contains(err.Error(), `queues[0] "a": max_bytes must be between 1048576`) {
		t.Fatalf("max_bytes below max_body_bytes: %v", err)
	}
}

// TestStoreBudget checks nats.store_budget: the queues with their own max_bytes take theirs,
// the others share the rest equally per stream (a fair queue has two); a budget too small
// names the field and the fix.
func TestStoreBudget(t *testing.T) {
	const mib = 1 << 20
	c, err := Parse("t.yaml", []byte(`nats: {url: "nats://127.0.0.1:4222", store_budget: 104857600}
queues:
  - {name: own, rate: 1/s, max_bytes: 20971520}
  - {name: plain, rate: 1/s}
  - {name: fair, rate: 1/s, fair: true, tenant: [ip]}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	// 100 MiB - 20 MiB = 80 MiB over 3 streams (plain's, fair's and its backlog).
	want := int64(80*mib) / 3
	if c.Queues[0].MaxBytes != 20*mib || c.Queues[1].MaxBytes != want || c.Queues[2].MaxBytes != want {
		t.Fatalf("max_bytes %d, %d, %d; want %d, %d, %d", c.Queues[0].MaxBytes, c.Queues[1].MaxBytes,
			c.Queues[2].MaxBytes, 20*mib, want, want)
	}
	for _, tc := range []struct{ file, want string }{
		{"nats: {url: \"nats://h:4222\", store_budget: 2097152}\nqueues:\n  - {name: a, rate: 1/s, max_bytes: 4194304}\n",
			`nats.store_budget: the queues' own max_bytes reserve 4194304 bytes, more than the budget's 2097152`},
		{"nats: {url: \"nats://h:4222\", store_budget: 3145728}\nqueues:\n  - {name: a, rate: 1/s}\n  - {name: b, rate: 1/s}\n  - {name: c, rate: 1/s}\n  - {name: d, rate: 1/s}\n",
			`queues[0] "a": max_bytes: nats.store_budget 3145728 shared among 4 queue streams leaves 786432 bytes each, less than this queue's max_body_bytes 1048576; raise store_budget`},
		{"nats: {url: \"nats://h:4222\", store_budget: -1}\n", `nats.store_budget must be between 0 and`},
		{"nats: {url: \"nats://h:4222\", store_budget: lots}\n", `nats.store_budget: want an integer, got "lots"`},
	} {
		if _, err := Parse("t.yaml", []byte(tc.file), nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.file, err, tc.want)
		}
	}
}

// TestSharedStreams checks nats.shared_streams: its default (16 shared streams, or a stream
// per queue when the file sets store_budget and not shared_streams), an explicit 0 beside a
// budget, a value of the file's, and bad values and an explicit count with store_budget refused
// naming the file and the field.
func TestSharedStreams(t *testing.T) {
	c, err := Parse("t.yaml", []byte("nats: {url: \"nats://h:4222\"}\n"), nil)
	if err != nil || c.NATS.SharedStreams != DefaultSharedStreams || DefaultSharedStreams != 16 {
		t.Fatalf("default: %v, %v", c, err)
	}
	c, err = Parse("t.yaml", []byte("nats: {url: \"nats://h:4222\", shared_streams: 0}\n"), nil)
	if err != nil || c.NATS.SharedStreams != 0 {
		t.Fatalf("shared_streams 0: %v, %v", c, err)
	}
	for _, file := range []string{
		"nats: {url: \"nats://h:4222\", store_budget: 104857600}\nqueues:\n  - {name: a, rate: 1/s}\n",
		"nats: {url: \"nats://h:4222\", store_budget: 104857600, shared_streams: 0}\nqueues:\n  - {name: a, rate: 1/s}\n",
	} {
		c, err = Parse("t.yaml", []byte(file), nil)
		if err != nil || c.NATS.SharedStreams != 0 || c.Queues[0].MaxBytes != 104857600 {
			t.Fatalf("%s: %+v, %v: want a stream per queue, the budget as the queue's max_bytes", file, c.NATS, err)
		}
	}
	c, err = Parse("t.yaml", []byte("nats: {url: \"nats://h:4222\", shared_streams: 4}\nqueues:\n  - {name: a, rate: 1/s}\n"), nil)
	if err != nil || c.NATS.SharedStreams != 4 {
		t.Fatalf("shared_streams 4: %v, %v", c, err)
	}
	for _, tc := range []struct{ file, want string }{
		{"nats: {url: \"nats://h:4222\", shared_streams: -1}\n", `nats.shared_streams must be between 0 and 1024, got -1`},
		{"nats: {url: \"nats://h:4222\", shared_streams: 5000}\n", `nats.shared_streams must be between 0 and 1024, got 5000`},
		{"nats: {url: \"nats://h:4222\", shared_streams: many}\n", `nats.shared_streams: want an integer, got "many"`},
		{"nats: {url: \"nats://h:4222\", shared_streams: 4, store_budget: 104857600}\n", `nats.shared_streams cannot be set above 0 with nats.store_budget`},
	} {
		_, err := Parse("t.yaml", []byte(tc.file), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "t.yaml") {
			t.Errorf("%s: got %v, want %q naming t.yaml", tc.file, err, tc.want)
		}
	}
}
