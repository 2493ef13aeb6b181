package app

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// The lifecycle starts services in order, stops the started ones in reverse order under one
// context that ends at the shutdown timeout, and names the service whose start failed.
func TestLifecycleOrder(t *testing.T) {
	var events []string
	svc := func(name string, startErr error) service {
		return service{
			name: name,
			start: func(context.Context) error {
				events = append(events, "start "+name)
				return startErr
			},
			stop: func(ctx context.Context) error {
				dl, ok := ctx.Deadline()
				if !ok || time.Until(dl) > time.Minute || time.Until(dl) < 50*time.Second {
					t.Errorf("stop %s: deadline %v (set %v), want about a minute from now", name, dl, ok)
				}
				events = append(events, "stop "+name)
				return nil
			},
		}
	}
	lc := newLifecycle("proc", slog.New(slog.NewTextHandler(io.Discard, nil)))
	refused := errors.New("refused")
	err := lc.start(context.Background(), svc("a", nil), service{name: "nothing to do"}, svc("b", nil), svc("c", refused), svc("d", nil))
	if !errors.Is(err, refused) || err.Error() != "proc: c: refused" {
		t.Fatalf("start = %v, want proc: c: refused", err)
	}
	lc.stop(time.Minute)
	want := []string{"start a", "start b", "start c", "stop b", "stop a"}
	if !slices.Equal(events, want) {
		t.Fatalf("events %v, want %v", events, want)
	}
}

// A background service that ends on its own with an error stops the process: wait returns its
// error, named. An optional one is only logged; http.ErrServerClosed is no error. Stopping ends
// every background run's context and waits for it.
func TestLifecycleBackground(t *testing.T) {
	var logs strings.Builder
	lc := newLifecycle("proc", slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	broken := errors.New("broken")
	stopped := make(chan string, 3)
	blocking := func(name string) func(context.Context) error {
		return func(ctx context.Context) error {
			<-ctx.Done()
			stopped <- name
			return nil
		}
	}
	// An optional service that fails, in a lifecycle of its own: stop waits for it.
	opt := newLifecycle("proc", slog.New(slog.NewTextHandler(&logs, nil)))
	if err := opt.start(ctx, opt.run("watcher", background{optional: true}, func(context.Context) error {
		return errors.New("no inotify")
	})); err != nil {
		t.Fatal(err)
	}
	opt.stop(time.Second)
	select {
	case err := <-opt.failed:
		t.Fatalf("an optional service's error failed the process: %v", err)
	default:
	}
	if !strings.Contains(logs.String(), "proc: watcher") || !strings.Contains(logs.String(), "no inotify") {
		t.Errorf("the optional service's error is not logged: %s", logs.String())
	}

	err := lc.start(ctx,
		lc.run("until stopped", background{}, blocking("until stopped")),
		lc.run("drains first", background{drainsFirst: true}, blocking("drains first")),
		lc.run("closed", background{}, func(context.Context) error { return http.ErrServerClosed }),
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.start(ctx, lc.run("listener", background{}, func(context.Context) error { return broken })); err != nil {
		t.Fatal(err)
	}
	if err := lc.wait(ctx); !errors.Is(err, broken) || err.Error() != "proc: listener: broken" {
		t.Fatalf("wait = %v, want proc: listener: broken", err)
	}

	// Run's ctx ends: the service that drains first sees it at once, the other not before
	// its stop.
	cancel()
	if got := <-stopped; got != "drains first" {
		t.Fatalf("%s ended first, want the one that drains first", got)
	}
	select {
	case got := <-stopped:
		t.Fatalf("%s ended before it was stopped", got)
	default:
	}
	lc.stop(time.Second)
	if got := <-stopped; got != "until stopped" {
		t.Fatalf("%s ended at stop", got)
	}
}
