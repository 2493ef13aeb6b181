// Package app assembles Sluice's two processes from their parts; cmd/ingress and cmd/worker are
// thin mains over [Ingress.Run] and [Worker.Run]. Both have one shape, the same steps in the
// same order:
//
//  1. load the config file (config.Load; an unusable one is a connect.ErrConfig error, exit 2);
//  2. connect the stores: Redis for limiter state and the leak schedule (connect.Redis), NATS
//     for the queues (connect.NATS, or the embedded server of the quickstart);
//  3. serve the admin listener (admin.New: health, readiness, metrics; the ingress adds the
//     queue reads and the operating API);
//  4. open the queues (openQueues: retry until NATS answers, then provision — one policy);
//  5. run: the ingress serves the echo front (ingress.Server) and, when NATS is embedded, an
//     in-process worker.Pool; the worker runs a worker.Pool;
//  6. watch the config file (config.Watcher) and apply valid changes;
//  7. on ctx's end, stop in reverse order within shutdown_timeout.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluice-rl/sluice/internal/admin"
	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/connect"
	"github.com/sluice-rl/sluice/internal/demo"
	"github.com/sluice-rl/sluice/internal/ingress"
	"github.com/sluice-rl/sluice/internal/worker"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/limit"
	"github.com/sluice-rl/sluice/queue"
)

// Ingress is the ingress process. The zero value of each optional field means its default.
type Ingress struct {
	// ConfigPath is the config file. Required.
	ConfigPath string
	// Logger receives the logs. Nil: text to stderr.
	Logger *slog.Logger
	// Ready, if set, is called with the public and admin listeners' addresses once the
	// process serves requests.
	Ready func(listen, admin string)
}

// Run serves until ctx ends, then stops accepting, lets requests and deliveries in flight
// finish within the config's shutdown_timeout, and returns nil. It returns a connect.ErrConfig error
// for an unusable config and other errors when a listener cannot be opened or the queues
// cannot be set up.
func (m Ingress) Run(ctx context.Context) (err error) {
	log := m.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	cfg, err := config.Load(m.ConfigPath)
	if err != nil {
		return connect.ConfigError(err)
	}
	var current atomic.Pointer[config.Config]
	current.Store(cfg)

	// Everything started below is stopped in reverse order on return.
	var stops []func()
	defer func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// Step 2: the stores.
	st, err := m.connectStores(cfg, log, &stops)
	if err != nil {
		return err
	}
	lim, schedule, nc, checks, embedded := st.lim, st.schedule, st.nc, st.checks, st.embedded

	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("ingress: jetstream: %w", err)
	}
	qs, err := openQueues(ctx, js, cfg, log)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}

	srv, err := ingress.New(cfg, ingress.Options{Limiter: lim, Enqueuer: qs, Registerer: reg, Logger: log})
	if err != nil {
		return connect.ConfigError(err)
	}
	stops = append(stops, srv.Close)

	// The in-process worker pool drains an embedded NATS server's queues: nothing outside
	// this process can reach them.
	var pool *worker.Pool
	if embedded {
		pool, err = worker.New(worker.Deps{
			Queues: qs, Schedule: schedule, Registerer: reg, Logger: log,
			ShutdownTimeout: cfg.ShutdownTimeout,
		}, worker.FromConfig(cfg))
		if err != nil {
			return connect.ConfigError(err)
		}
	}

	// Listeners first, so that a taken port is reported before anything is served.
	ln, adminLn, demoLn, err := listen(cfg)
	if err != nil {
		return err
	}

	if admin.Exposed(cfg.AdminListen, cfg.AdminToken) {
		log.Warn("ingress: admin_listen is reachable from other hosts and no admin_token is set: anyone who reaches it reads queue state and metrics; set admin_token (or SLUICE_ADMIN_TOKEN) or bind it to 127.0.0.1", "admin_listen", cfg.AdminListen)
	}
	adm := admin.New(cfg.AdminListen, reg, checks...)
	queues := &admin.Queues{
		Info:        qs,
		Config:      current.Load,
		PausedUntil: pausedUntil(schedule),
		Controls:    qs.Controls,
		Tenant:      qs.Tenant,
	}
	if ad, ok := schedule.(leaky.Adapter); ok {
		queues.Learned = ad.Learned
	}
	queues.Mount(adm)
	reg.MustRegister(queues.Metrics())
	ops := &admin.Ops{Q: qs, Queues: queues, Token: cfg.AdminToken, Logger: log, Gatherer: reg}
	if err := ops.Mount(adm, reg); err != nil {
		return err
	}

	var wg sync.WaitGroup
	run := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("ingress: "+name, "err", err)
			}
		}()
	}
	// background is cancelled after the graceful shutdown below, not with ctx.
	background, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	defer func() { stopBackground(); wg.Wait() }()

	run("admin listener", func() error { return adm.Serve(background, adminLn) })
	if demoLn != nil {
		demoSrv := &http.Server{Handler: demo.Handler(log), ReadHeaderTimeout: 10 * time.Second}
		run("demo upstream", func() error { return demoSrv.Serve(demoLn) })
		context.AfterFunc(background, func() { demoSrv.Close() })
		log.Info("ingress: demo upstream", "addr", demoLn.Addr().String())
	}
	poolDone := make(chan struct{})
	if pool != nil {
		poolCtx, stopPool := context.WithCancel(ctx)
		defer stopPool()
		go func() {
			defer close(poolDone)
			if err := pool.Run(poolCtx); err != nil {
				log.Error("ingress: worker pool", "err", err)
			}
		}()
		log.Info("ingress: in-process workers drain the queues", "queues", len(cfg.Queues))
	} else {
		close(poolDone)
	}

	// Reload on SIGHUP and on file change; an invalid file keeps the old config.
	run("config watcher", func() error {
		w := &config.Watcher{
			Path:     m.ConfigPath,
			Current:  cfg,
			OnChange: func(next *config.Config) { m.apply(background, log, adm, srv, qs, pool, &current, next) },
			OnError: func(err error) {
				adm.ReloadFailed()
				log.Error("ingress: reload refused; keeping the old config", "err", err)
			},
		}
		return w.Run(background)
	})

	httpSrv := &http.Server{
		Handler:           srv.Handler(),
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       cfg.ReadTimeout, // the body too: a stalled one is cut off, 408
		IdleTimeout:       2 * time.Minute,
	}
	run("listener", func() error { return httpSrv.Serve(ln) })
	log.Info("ingress: listening", "addr", ln.Addr().String(), "admin", adminLn.Addr().String(),
		"rules", len(cfg.Rules), "queues", len(cfg.Queues), "redis", cfg.Redis != nil)
	if m.Ready != nil {
		m.Ready(ln.Addr().String(), adminLn.Addr().String())
	}

	<-ctx.Done()
	log.Info("ingress: shutting down", "timeout", current.Load().ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), current.Load().ShutdownTimeout)
	defer cancel()
	if err := httpSrv.Shutdown(sctx); err != nil {
		log.Warn("ingress: requests still in flight at the shutdown timeout", "err", err)
		httpSrv.Close()
	}
	<-poolDone // the pool has its own shutdown timeout
	// Withdrawals of jobs stored after their 503 (queue: retract) finish, within the budget.
	if err := qs.Close(sctx); err != nil {
		log.Warn("ingress: stopped before withdrawing every job stored after its 503", "err", err)
	}
	log.Info("ingress: stopped")
	return nil
}

// stores are what the ingress connected to in step 2.
type stores struct {
	lim      limit.Limiter // nil: in-process memory (ingress.New's default)
	schedule leaky.Schedule
	nc       *nats.Conn
	checks   []admin.Check
	embedded bool // NATS is the quickstart's embedded server
}

// connectStores connects the limiter store (Redis when configured, else memory) and NATS (the
// configured servers, or the embedded one of the quickstart), appending what it starts to stops.
func (m Ingress) connectStores(cfg *config.Config, log *slog.Logger, stops *[]func()) (stores, error) {
	var st stores
	if cfg.Redis != nil {
		connect.RouteRedisLogs(log)
		rdb, err := connect.Redis(cfg.Redis.URL)
		if err != nil {
			return st, connect.ConfigError(fmt.Errorf("%s: redis.url: %w", cfg.Path, err))
		}
		*stops = append(*stops, func() { rdb.Close() })
		st.lim = limit.NewRedis(rdb, limit.RedisConfig{})
		st.schedule = leaky.NewRedis(rdb, leaky.RedisConfig{})
		st.checks = append(st.checks, admin.RedisCheck(rdb))
	} else {
		st.schedule = leaky.NewMemory(nil)
	}
	st.embedded = cfg.NATS == nil
	if st.embedded {
		ens, err := startEmbeddedNATS(cfg.DataDir)
		if errors.Is(err, errNoEmbedded) {
			return st, connect.ConfigError(fmt.Errorf("%s: %w", m.ConfigPath, err))
		}
		if err != nil {
			return st, err
		}
		*stops = append(*stops, ens.stop)
		if st.nc, err = ens.connect(); err != nil {
			return st, fmt.Errorf("embedded nats: connect: %w", err)
		}
		log.Info("ingress: embedded NATS with JetStream", "store", ens.storeDir())
	} else {
		var err error
		if st.nc, err = connect.NATS(cfg.NATS.URL, "sluice-ingress", log); err != nil {
			return st, err
		}
	}
	*stops = append(*stops, st.nc.Close)
	st.checks = append(st.checks, admin.NATSCheck(st.nc))
	return st, nil
}

// listen opens the public, admin and (when configured) demo listeners, all or none.
func listen(cfg *config.Config) (ln, adminLn, demoLn net.Listener, err error) {
	if ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, nil, nil, fmt.Errorf("ingress: listen %s: %w", cfg.Listen, err)
	}
	if adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
		ln.Close()
		return nil, nil, nil, fmt.Errorf("ingress: admin listen %s: %w", cfg.AdminListen, err)
	}
	if cfg.DemoUpstream != "" {
		if demoLn, err = net.Listen("tcp", cfg.DemoUpstream); err != nil {
			ln.Close()
			adminLn.Close()
			return nil, nil, nil, fmt.Errorf("ingress: demo upstream listen %s: %w", cfg.DemoUpstream, err)
		}
	}
	return ln, adminLn, demoLn, nil
}

// apply makes a valid new config current: rules and limits at once, new and changed queues
// provisioned, the in-process pool's rates updated. Listen addresses and the redis and nats
// sections take effect at the next restart.
func (m Ingress) apply(ctx context.Context, log *slog.Logger, adm *admin.Server, srv *ingress.Server,
	qs *queue.Queues, pool *worker.Pool, current *atomic.Pointer[config.Config], next *config.Config) {
	old := current.Load()
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := qs.Provision(pctx, QueueSpecs(next)); err != nil {
		adm.ReloadFailed()
		log.Error("ingress: reload refused: provision queues; keeping the old config", "err", err)
		return
	}
	if err := srv.Reload(next); err != nil {
		adm.ReloadFailed()
		log.Error("ingress: reload refused; keeping the old config", "err", err)
		return
	}
	if pool != nil {
		if err := pool.Reload(worker.FromConfig(next)); err != nil {
			log.Error("ingress: reload: worker pool keeps its old queues", "err", err)
		}
	}
	current.Store(next)
	if old.Listen != next.Listen || old.AdminListen != next.AdminListen ||
		(old.Redis == nil) != (next.Redis == nil) || (old.NATS == nil) != (next.NATS == nil) ||
		(old.Redis != nil && old.Redis.URL != next.Redis.URL) || (old.NATS != nil && old.NATS.URL != next.NATS.URL) {
		log.Warn("ingress: listen addresses, redis and nats take effect at the next restart")
	}
	log.Info("ingress: config reloaded", "rules", len(next.Rules), "queues", len(next.Queues))
}

func queueNames(cfg *config.Config) []string {
	names := make([]string, len(cfg.Queues))
	for i, q := range cfg.Queues {
		names[i] = q.Name
	}
	return names
}

// openQueues creates the queue layer and provisions the config's queues, retrying while NATS
// cannot be reached (100ms, doubling to 5s), until ctx ends: the one connect policy of the
// ingress and the worker.
func openQueues(ctx context.Context, js jetstream.JetStream, cfg *config.Config, log *slog.Logger) (*queue.Queues, error) {
	replicas := 1
	if cfg.NATS != nil {
		replicas = cfg.NATS.Replicas
	}
	wait := 100 * time.Millisecond
	for {
		qctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		qs, err := queue.New(qctx, js, queue.Options{StatusTTL: cfg.JobRetention, Replicas: replicas, IDSecret: cfg.IDSecretBytes()})
		if err == nil && cfg.NATS == nil {
			// The quickstart: this process is the only consumer. The jobs its pool handed
			// back at the last shutdown are pending in the consumer's stored state until their
			// ack wait runs out; a fresh consumer delivers every unacked job at once, in order.
			err = qs.ResetConsumers(qctx, queueNames(cfg))
		}
		if err == nil {
			err = qs.Provision(qctx, QueueSpecs(cfg))
		}
		cancel()
		if err == nil {
			return qs, nil
		}
		log.Warn("ingress: queues unavailable; retrying", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// pausedUntil adapts a leak schedule to the admin API's view of a queue's pause.
func pausedUntil(s leaky.Schedule) func(ctx context.Context, q string) (time.Time, bool, error) {
	return func(ctx context.Context, q string) (time.Time, bool, error) {
		d, err := s.PausedFor(ctx, q)
		if err != nil || d <= 0 {
			return time.Time{}, false, err
		}
		return time.Now().Add(d), true, nil
	}
}
