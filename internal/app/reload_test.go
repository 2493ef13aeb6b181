package app

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluice-rl/sluice/internal/config"
)

func mustParse(t *testing.T, yaml string) *config.Config {
	t.Helper()
	cfg, err := config.Parse("sluice.yaml", []byte(yaml), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// The one reload policy: a refused reload (an invalid file, or a step that fails) is counted
// and logged and leaves the current config; an applied one runs every step in order, becomes
// current, and names the keys that wait for a restart.
func TestReloadPolicy(t *testing.T) {
	old := mustParse(t, "listen: 127.0.0.1:1\nqueues: [{name: a, rate: 1/s}]\n")
	next := mustParse(t, "listen: 127.0.0.1:2\nread_timeout: 5s\nqueues: [{name: a, rate: 2/s}]\n")
	var logs strings.Builder
	var current atomic.Pointer[config.Config]
	current.Store(old)
	failures := 0
	var ran []string
	failAt := ""
	step := func(name string) reloadStep {
		return reloadStep{name, func(ctx context.Context, c *config.Config) error {
			if _, ok := ctx.Deadline(); !ok {
				t.Errorf("step %s without a deadline", name)
			}
			if c != next {
				t.Errorf("step %s got %p, want the new config", name, c)
			}
			ran = append(ran, name)
			if name == failAt {
				return errors.New("cannot")
			}
			return nil
		}}
	}
	r := &reloader{proc: "proc", log: slog.New(slog.NewTextHandler(&logs, nil)), failed: func() { failures++ },
		current: &current, steps: []reloadStep{step("provision queues"), step("rules"), step("worker pool")}}

	// An invalid file.
	r.refuse(errors.New("sluice.yaml: rules[0]: bad"))
	if failures != 1 || current.Load() != old || !strings.Contains(logs.String(), "proc: reload refused; keeping the old config") {
		t.Fatalf("invalid file: %d failures, current %p (old %p), logs %s", failures, current.Load(), old, logs.String())
	}

	// A step that fails: the steps after it do not run.
	failAt, logs = "rules", strings.Builder{}
	r.apply(context.Background(), next)
	if failures != 2 || current.Load() != old || !slices.Equal(ran, []string{"provision queues", "rules"}) ||
		!strings.Contains(logs.String(), "rules: cannot") {
		t.Fatalf("failing step: %d failures, current %p (old %p), steps %v, logs %s", failures, current.Load(), old, ran, logs.String())
	}

	// Every step succeeds.
	failAt, ran, logs = "", nil, strings.Builder{}
	r.apply(context.Background(), next)
	if failures != 2 || current.Load() != next || len(ran) != 3 {
		t.Fatalf("applied: %d failures, current %p (next %p), steps %v", failures, current.Load(), next, ran)
	}
	if !strings.Contains(logs.String(), "keys=\"[listen read_timeout]\"") || !strings.Contains(logs.String(), "proc: config reloaded") {
		t.Fatalf("applied: logs %s, want the restart-only keys listen and read_timeout named", logs.String())
	}
}
