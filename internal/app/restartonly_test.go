package app

import (
	"slices"
	"testing"

	"github.com/sluice-rl/sluice/internal/config"
)

// A reload that adds, changes or removes the tracing section names it among the keys that
// apply at the next restart: the tracer is made once, at start.
func TestRestartOnlyNamesTracing(t *testing.T) {
	off := &config.Config{}
	on := &config.Config{Tracing: &config.Tracing{OTLP: "http://c:4318", SampleRatio: 1}}
	half := &config.Config{Tracing: &config.Tracing{OTLP: "http://c:4318", SampleRatio: 0.5}}
	for _, tc := range []struct {
		old, next *config.Config
		want      bool
	}{{off, on, true}, {on, off, true}, {on, half, true}, {on, on, false}, {off, off, false}} {
		if got := slices.Contains(restartOnly(tc.old, tc.next), "tracing"); got != tc.want {
			t.Errorf("%+v -> %+v: tracing named %v, want %v", tc.old.Tracing, tc.next.Tracing, got, tc.want)
		}
	}
}

// A reload that changes nats.shared_streams names it: the queue layer takes it at start.
func TestRestartOnlyNamesSharedStreams(t *testing.T) {
	off := &config.Config{NATS: &config.NATS{URL: "nats://h:4222"}}
	on := &config.Config{NATS: &config.NATS{URL: "nats://h:4222", SharedStreams: 16}}
	if !slices.Contains(restartOnly(off, on), "nats.shared_streams") || slices.Contains(restartOnly(on, on), "nats.shared_streams") {
		t.Errorf("off -> on: %v; on -> on: %v", restartOnly(off, on), restartOnly(on, on))
	}
}

// A reload that sets, changes or unsets nats.jetstream_domain names it: the processes make
// their JetStream context at start.
func TestRestartOnlyNamesJetStreamDomain(t *testing.T) {
	none := &config.Config{NATS: &config.NATS{URL: "nats://h:4222"}}
	hub := &config.Config{NATS: &config.NATS{URL: "nats://h:4222", JetStreamDomain: "hub"}}
	eu := &config.Config{NATS: &config.NATS{URL: "nats://h:4222", JetStreamDomain: "eu"}}
	for _, tc := range []struct {
		old, next *config.Config
		want      bool
	}{{none, hub, true}, {hub, eu, true}, {hub, none, true}, {hub, hub, false}, {none, none, false}} {
		if got := slices.Contains(restartOnly(tc.old, tc.next), "nats.jetstream_domain"); got != tc.want {
			t.Errorf("%q -> %q: named %v, want %v", tc.old.NATS.JetStreamDomain, tc.next.NATS.JetStreamDomain, got, tc.want)
		}
	}
}
