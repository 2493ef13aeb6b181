package rls

import (
	"context"
	"fmt"
	"net"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
)

// Serve serves the rate-limit service, the gRPC health service (SERVING for "" and for
// envoy.service.ratelimit.v3.RateLimitService) and, when the config asks for it, reflection,
// on ln until ctx ends. Then it reports NOT_SERVING, lets calls in flight finish within grace
// and cuts the rest off. It returns nil after ctx ended, else the error that stopped it.
func (s *Server) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	gs := grpc.NewServer(serverOptions()...)
	rlsv3.RegisterRateLimitServiceServer(gs, s)
	hs := health.NewServer()
	hs.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	if s.reflection {
		reflection.Register(gs)
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		hs.Shutdown()
		done := make(chan struct{})
		go func() { gs.GracefulStop(); close(done) }()
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			gs.Stop()
			<-done
		}
	}()
	err := gs.Serve(ln)
	if ctx.Err() != nil {
		<-stopped
		return nil
	}
	gs.Stop()
	return err
}

// streamWorkers is how many goroutines serve calls (grpc.NumStreamWorkers). A worker keeps
// the stack a call grew to (gRPC's decoding, the handler, go-redis's reply), so calls do not
// pay to grow a fresh goroutine's stack each time, which was a tenth of the CPU under load
// (BENCHMARKS.md, "rls"). Calls beyond that many in flight at once get a goroutine each, as
// without workers; each idle worker costs its stack.
const streamWorkers = 64

// serverOptions are the gRPC server's: the stream workers. (Connections already share their
// write buffers: gRPC's default.)
func serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.NumStreamWorkers(streamWorkers)}
}

// Watch reloads the domain files whenever the config directory changes, until ctx ends: a set
// that compiles replaces the current one; one that does not is logged and counted, and the
// current one stays. File events are debounced by debounce (0: 100ms). It returns an error
// only if it cannot watch the directory.
func (s *Server) Watch(ctx context.Context, debounce time.Duration, reloaded func(error)) error {
	dir := s.dir
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("rls: watch %s: %w", dir, err)
	}
	defer fw.Close()
	if err := fw.Add(dir); err != nil {
		return fmt.Errorf("rls: watch %s: %w", dir, err)
	}
	if debounce <= 0 {
		debounce = 100 * time.Millisecond
	}
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-fw.Events:
			if !ok {
				return nil
			}
			if ev.Op != fsnotify.Chmod {
				t.Reset(debounce)
			}
		case err, ok := <-fw.Errors:
			if !ok {
				return nil
			}
			s.log.Warn("rls: watch", "dir", dir, "err", err)
		case <-t.C:
			err := s.Reload()
			if reloaded != nil {
				reloaded(err)
			}
		}
	}
}

// Reload reads the domain files again: a set that compiles under the current config replaces
// the domains; else the error names the file and field, and the domains stay as they were.
func (s *Server) Reload() error {
	cfg := s.cfg.Load()
	d, err := LoadDir(s.dir, cfg)
	if err != nil {
		s.m.reloads.WithLabelValues("error").Inc()
		s.log.Error("rls: reload refused; the domains stay as they were", "err", err)
		return err
	}
	s.SetDomains(d)
	s.m.reloads.WithLabelValues("ok").Inc()
	s.log.Info("rls: domains reloaded", "domains", len(d.byName))
	return nil
}
