package config

import "testing"

// A tracing section is read with its default ratio; without one, tracing is off (nil).
func TestTracing(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want *Tracing
	}{
		{"listen: ':1'\n", nil},
		{"tracing: {otlp: 'http://127.0.0.1:4318'}\n", &Tracing{OTLP: "http://127.0.0.1:4318", SampleRatio: 1}},
		{"tracing: {otlp: 'https://otel.example/base', sample_ratio: 0.25}\n", &Tracing{OTLP: "https://otel.example/base", SampleRatio: 0.25}},
		{"tracing: {otlp: 'http://c:4318', sample_ratio: 0}\n", &Tracing{OTLP: "http://c:4318", SampleRatio: 0}},
	} {
		cfg, err := Parse("sluice.yaml", []byte(tc.yaml), nil)
		if err != nil {
			t.Fatalf("%q: %v", tc.yaml, err)
		}
		switch {
		case tc.want == nil && cfg.Tracing != nil:
			t.Errorf("%q: tracing %+v, want off", tc.yaml, *cfg.Tracing)
		case tc.want != nil && (cfg.Tracing == nil || *cfg.Tracing != *tc.want):
			t.Errorf("%q: tracing %+v, want %+v", tc.yaml, cfg.Tracing, *tc.want)
		}
	}
}
