package app

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
)

// reloadStep is one part of applying a new config, named for the logs.
type reloadStep struct {
	name  string
	apply func(ctx context.Context, next *config.Config) error
}

// reloader is the reload policy of both processes, in one place:
//
//   - a file that cannot be read or is invalid is refused: logged, counted (failed, which is
//     sluice_config_reload_errors_total), and the current config stays;
//   - a valid file is applied step by step, in order; the first step that fails refuses the
//     reload in the same way — logged with the step's name, counted, the current config stays.
//     Steps before it stay applied: provisioning only creates or updates streams, and the
//     swaps (rules, pool) come last and fail only for a config that Parse accepted but a
//     component cannot run, which no test has found;
//   - once every step succeeded the file is the current config, and the keys read only at
//     start-up that changed are named in a warning.
type reloader struct {
	proc    string
	log     *slog.Logger
	failed  func() // counts a refused reload
	current *atomic.Pointer[config.Config]
	steps   []reloadStep
}

// reloadTimeout bounds the steps of one reload (provisioning talks to NATS).
const reloadTimeout = 20 * time.Second

// watcher returns the config.Watcher of path that hands its results to r until ctx ends.
func (r *reloader) watcher(ctx context.Context, path string) *config.Watcher {
	return &config.Watcher{
		Path:     path,
		Current:  r.current.Load(),
		OnChange: func(next *config.Config) { r.apply(ctx, next) },
		OnError:  r.refuse,
	}
}

// refuse counts and logs a reload that could not be applied.
func (r *reloader) refuse(err error) {
	r.failed()
	r.log.Error(r.proc+": reload refused; keeping the old config", "err", err)
}

// apply applies next by r's steps and makes it current, or refuses it.
func (r *reloader) apply(ctx context.Context, next *config.Config) {
	ctx, cancel := context.WithTimeout(ctx, reloadTimeout)
	defer cancel()
	for _, s := range r.steps {
		if err := s.apply(ctx, next); err != nil {
			r.refuse(fmt.Errorf("%s: %w", s.name, err))
			return
		}
	}
	old := r.current.Swap(next)
	if keys := restartOnly(old, next); len(keys) > 0 {
		r.log.Warn(r.proc+": reload: these keys apply at the next restart", "keys", keys)
	}
	r.log.Info(r.proc+": config reloaded", "rules", len(next.Rules), "queues", len(next.Queues))
}

// restartOnly names the keys that differ between old and next and that a process reads only
// when it starts.
func restartOnly(old, next *config.Config) []string {
	var keys []string
	add := func(changed bool, key string) {
		if changed {
			keys = append(keys, key)
		}
	}
	add(old.Listen != next.Listen, "listen")
	add(old.AdminListen != next.AdminListen, "admin_listen")
	add(old.AdminToken != next.AdminToken, "admin_token")
	add(redisURL(old) != redisURL(next), "redis")
	add(natsURL(old) != natsURL(next), "nats")
	add(sharedStreams(old) != sharedStreams(next), "nats.shared_streams")
	add(jsDomain(old) != jsDomain(next), "nats.jetstream_domain")
	add(old.DataDir != next.DataDir, "data_dir")
	add(old.DemoUpstream != next.DemoUpstream, "demo_upstream")
	add(old.MaxHeaderBytes != next.MaxHeaderBytes, "max_header_bytes")
	add(old.ReadTimeout != next.ReadTimeout, "read_timeout")
	add(old.JobRetention != next.JobRetention, "job_retention")
	add(old.IDSecret != next.IDSecret, "id_secret")
	add(old.RLSListen != next.RLSListen, "rls_listen")
	add((old.RLS == nil) != (next.RLS == nil) || old.RLS != nil && next.RLS != nil && *old.RLS != *next.RLS, "rls")
	add(tracingOf(old) != tracingOf(next), "tracing")
	return keys
}

func tracingOf(c *config.Config) config.Tracing {
	if c.Tracing == nil {
		return config.Tracing{}
	}
	return *c.Tracing
}

func redisURL(c *config.Config) string {
	if c.Redis == nil {
		return ""
	}
	return c.Redis.URL
}

func natsURL(c *config.Config) string {
	if c.NATS == nil {
		return ""
	}
	return c.NATS.URL
}

// jsDomain is c's nats.jetstream_domain; the processes make their JetStream context at start.
func jsDomain(c *config.Config) string {
	if c.NATS == nil {
		return ""
	}
	return c.NATS.JetStreamDomain
}

// sharedStreams is c's nats.shared_streams; the queue layer takes it once, at start.
func sharedStreams(c *config.Config) int {
	if c.NATS == nil {
		return 0
	}
	return c.NATS.SharedStreams
}
