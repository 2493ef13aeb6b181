package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"
)

// service is one named part of a process: a store's connection, a listener, the worker pool.
// start brings it up; stop, called only if start succeeded, takes it down under a context that
// ends at the shutdown timeout. Either may be nil.
type service struct {
	name  string
	start func(ctx context.Context) error
	stop  func(ctx context.Context) error
}

// lifecycle starts a process's services in order and stops the started ones in reverse order,
// so that each service is stopped while everything it was started on still runs. It is used by
// one goroutine (Run's); the services it runs in the background report to it on their own.
type lifecycle struct {
	proc    string // "ingress" or "worker": the prefix of errors and logs
	log     *slog.Logger
	started []service
	failed  chan error // the first background service that ended on its own
}

func newLifecycle(proc string, log *slog.Logger) *lifecycle {
	return &lifecycle{proc: proc, log: log, failed: make(chan error, 1)}
}

// start starts services in order. It stops at the first that fails and returns its error,
// prefixed with the process and the service's name; the services started before it are
// still started, and stop takes them down.
func (l *lifecycle) start(ctx context.Context, services ...service) error {
	for _, s := range services {
		if s.start != nil {
			if err := s.start(ctx); err != nil {
				return fmt.Errorf("%s: %s: %w", l.proc, s.name, err)
			}
		}
		l.started = append(l.started, s)
	}
	return nil
}

// fail stops the process with err of service name, as a background service that ends on its
// own does: wait returns it (the first such error only). Safe from any goroutine.
func (l *lifecycle) fail(name string, err error) {
	select {
	case l.failed <- fmt.Errorf("%s: %s: %w", l.proc, name, err):
	default:
	}
}

// wait blocks until ctx ends (nil) or a background service fails (its error).
func (l *lifecycle) wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case err := <-l.failed:
		return err
	}
}

// stop stops the started services in reverse order, all under one context that ends timeout
// from now, and logs the stops that fail. It stops every service, however the others fare.
func (l *lifecycle) stop(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for i := len(l.started) - 1; i >= 0; i-- {
		s := l.started[i]
		if s.stop == nil {
			continue
		}
		if err := s.stop(ctx); err != nil {
			l.log.Warn(l.proc+": stop "+s.name, "err", err)
		}
	}
	l.started = nil
}

// background says how a background service's run relates to the process.
type background struct {
	// drainsFirst: run's context ends as soon as the process is told to stop (Run's ctx), not
	// when the lifecycle stops the service, so that its own graceful shutdown (the worker
	// pool's, with its own timeout) overlaps the stops of the services started after it.
	drainsFirst bool
	// optional: an error run returns is logged and the process carries on without the
	// service (the config watcher: a process that cannot watch its file still serves).
	// Otherwise it stops the process, and Run returns it.
	optional bool
}

// run is a service that runs f on its own goroutine from start until stop, which ends f's
// context and waits for f to return. f returning before that is a failure of the process,
// unless b.optional; http.ErrServerClosed is not an error.
func (l *lifecycle) run(name string, b background, f func(ctx context.Context) error) service {
	var (
		cancel context.CancelFunc
		done   chan struct{}
	)
	return service{
		name: name,
		start: func(ctx context.Context) error {
			base := ctx
			if !b.drainsFirst {
				base = context.WithoutCancel(ctx)
			}
			var rctx context.Context
			rctx, cancel = context.WithCancel(base)
			done = make(chan struct{})
			go func() {
				defer close(done)
				err := f(rctx)
				if err == nil || errors.Is(err, http.ErrServerClosed) {
					return
				}
				l.log.Error(l.proc+": "+name, "err", err)
				if !b.optional && rctx.Err() == nil {
					l.fail(name, err)
				}
			}()
			return nil
		},
		stop: func(context.Context) error {
			cancel()
			<-done
			return nil
		},
	}
}
