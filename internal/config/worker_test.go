package config

import (
	"strings"
	"testing"
)

// TestWorkerDirectHTTP: worker.direct_http is a boolean, true when absent; anything else is
// refused naming the file and the field, with every other problem of the file.
func TestWorkerDirectHTTP(t *testing.T) {
	for _, tc := range []struct {
		yaml    string
		netOnly bool
	}{
		{"listen: ':1'\n", false},
		{"worker: {}\n", false},
		{"worker:\n", false},
		{"worker: {direct_http: true}\n", false},
		{"worker: {direct_http: false}\n", true},
	} {
		cfg, err := Parse("sluice.yaml", []byte(tc.yaml), nil)
		if err != nil {
			t.Fatalf("%q: %v", tc.yaml, err)
		}
		if cfg.Worker.NetHTTPOnly != tc.netOnly {
			t.Errorf("%q: NetHTTPOnly %v, want %v", tc.yaml, cfg.Worker.NetHTTPOnly, tc.netOnly)
		}
	}
	for yaml, want := range map[string]string{
		"worker: {direct_http: maybe}\n":  `sluice.yaml: worker.direct_http: want true or false, got "maybe"`,
		"worker: {direct_http: ''}\n":     `sluice.yaml: worker.direct_http: want true or false, got ""`,
		"worker: {direct_http: [true]}\n": `sluice.yaml: worker.direct_http: want a single value, not a list`,
		"worker: {direct_htp: false}\n":   `sluice.yaml:1: worker: unknown field "direct_htp"`,
		"worker: false\n":                 `sluice.yaml:1: worker: want a mapping, not a single value`,
	} {
		_, err := Parse("sluice.yaml", []byte(yaml), nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error with %q", yaml, err, want)
		}
	}
	_, err := Parse("sluice.yaml", []byte("worker: {direct_http: 2}\nshadow: x\n"), nil)
	if err == nil || !strings.Contains(err.Error(), `worker.direct_http: want true or false, got "2"`) {
		t.Errorf("both problems of a file: %v", err)
	}
}
