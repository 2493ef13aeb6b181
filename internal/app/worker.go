package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluice-rl/sluice/internal/admin"
	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/connect"
	"github.com/sluice-rl/sluice/internal/worker"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/queue"
)

func configErr(err error) error           { return connect.ConfigError(err) }
func configErrf(f string, a ...any) error { return configErr(fmt.Errorf(f, a...)) }

// Worker is the standalone worker process, which cmd/worker runs. It has the ingress's shape
// (see the package doc): it loads the config file, connects to Redis (the shared leak schedule)
// and NATS (the queues), serves /healthz, /readyz and /metrics on the config's admin_listen,
// opens and provisions the queues (openQueues, the one connect policy of both processes),
// drains them with a worker.Pool, reloads on SIGHUP or when the file changes, and shuts down
// gracefully when Run's context ends.
type Worker struct {
	// ConfigPath is the config file. Required.
	ConfigPath string
	// Logger receives the logs. Nil: text to stderr.
	Logger *slog.Logger
	// Ready, if set, is called with the admin listener's address once the worker drains.
	Ready func(adminAddr string)
}

// Run runs the worker until ctx ends, then shuts down within the config's shutdown_timeout and
// returns nil. It returns a connect.ErrConfig error for an unusable config, and other errors when the
// admin listener cannot be opened or the queues cannot be provisioned.
func (m Worker) Run(ctx context.Context) error {
	log := m.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	cfg, err := config.Load(m.ConfigPath)
	if err != nil {
		return configErr(err)
	}
	if err := needsStores(cfg); err != nil {
		return err
	}

	// Redis: the leak schedule.
	connect.RouteRedisLogs(log)
	rdb, err := connect.Redis(cfg.Redis.URL)
	if err != nil {
		return configErrf("%s: redis.url: %w", cfg.Path, err)
	}
	defer rdb.Close()

	// NATS: the queues. The connection retries in the background, so the worker starts (and
	// reports not ready) while NATS is down.
	nc, err := connect.NATS(cfg.NATS.URL, "sluice-worker", log)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	defer nc.Close()

	// Metrics and the admin listener, up from the start so /readyz tells why the worker is
	// not draining yet; it stops after the pool.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reloads := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_config_reloads_total",
		Help: "Config reloads applied.",
	})
	reg.MustRegister(reloads)
	var draining atomic.Bool
	if admin.Exposed(cfg.AdminListen, cfg.AdminToken) {
		log.Warn("worker: admin_listen is reachable from other hosts and no admin_token is set: anyone who reaches it reads queue state and metrics; set admin_token (or SLUICE_ADMIN_TOKEN) or bind it to 127.0.0.1", "admin_listen", cfg.AdminListen)
	}
	adm := admin.New(cfg.AdminListen, reg,
		admin.Check{Name: "worker", Func: func(context.Context) error {
			if !draining.Load() {
				return errors.New("not draining")
			}
			return nil
		}},
		admin.RedisCheck(rdb), admin.NATSCheck(nc))
	ln, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		return fmt.Errorf("worker: admin listener: %w", err)
	}
	adminCtx, stopAdmin := context.WithCancel(context.WithoutCancel(ctx))
	adminDone := make(chan struct{})
	go func() {
		defer close(adminDone)
		if err := adm.Serve(adminCtx, ln); err != nil {
			log.Error("worker: admin listener", "err", err)
		}
	}()
	defer func() { stopAdmin(); <-adminDone }()
	log.Info("worker: admin listening", "addr", ln.Addr().String())

	// The queue layer, once NATS answers.
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("worker: jetstream: %w", err)
	}
	qs, err := openQueues(ctx, js, cfg, log)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}

	specs := worker.FromConfig(cfg)
	pool, err := worker.New(worker.Deps{
		Queues:          qs,
		Schedule:        leaky.NewRedis(rdb, leaky.RedisConfig{}),
		Registerer:      reg,
		Logger:          log,
		ShutdownTimeout: cfg.ShutdownTimeout,
	}, specs)
	if err != nil {
		return configErr(err)
	}

	// Reload on SIGHUP and when the file changes. A new config that cannot be applied is
	// refused like an invalid one.
	wctx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		w := &config.Watcher{
			Path:    m.ConfigPath,
			Current: cfg,
			OnChange: func(next *config.Config) {
				if next.NATS == nil || next.Redis == nil || next.NATS.URL != cfg.NATS.URL ||
					next.Redis.URL != cfg.Redis.URL || next.AdminListen != cfg.AdminListen {
					log.Warn("worker: reload: nats, redis and admin_listen changes apply only after a restart")
				}
				// Provision first, so that new queues have their consumer when the pool
				// starts on them.
				pctx, cancel := context.WithTimeout(wctx, 20*time.Second)
				defer cancel()
				if err := qs.Provision(pctx, QueueSpecs(next)); err != nil {
					log.Error("worker: reload: provision queues", "err", err)
				}
				if err := pool.Reload(worker.FromConfig(next)); err != nil {
					adm.ReloadFailed()
					log.Error("worker: reload refused; keeping the old config", "err", err)
					return
				}
				reloads.Inc()
				log.Info("worker: config reloaded", "queues", len(next.Queues))
			},
			OnError: func(err error) {
				adm.ReloadFailed()
				log.Error("worker: reload refused; keeping the old config", "err", err)
			},
		}
		if err := w.Run(wctx); err != nil {
			log.Error("worker: config watcher", "err", err)
		}
	}()
	defer func() { stopWatch(); <-watchDone }()

	draining.Store(true)
	log.Info("worker: draining", "queues", len(specs), "nats", cfg.NATS.URL)
	if m.Ready != nil {
		m.Ready(ln.Addr().String())
	}
	err = pool.Run(ctx)
	draining.Store(false)
	log.Info("worker: stopped")
	return err
}

// needsStores refuses a config without the nats and redis sections a standalone worker shares
// with the ingress, saying what is missing and what to run instead.
func needsStores(cfg *config.Config) error {
	if cfg.NATS != nil && cfg.Redis != nil {
		return nil
	}
	var missing []string
	if cfg.NATS == nil {
		missing = append(missing, "`nats`")
	}
	if cfg.Redis == nil {
		missing = append(missing, "`redis`")
	}
	return configErrf("%s: the standalone worker needs `nats` and `redis` sections (or "+
		"SLUICE_NATS_URL and SLUICE_REDIS_URL) to share queues and the leak schedule with "+
		"the ingress; missing %s. Without them the quickstart runs its workers inside the "+
		"ingress: go run ./cmd/ingress -config %s",
		cfg.Path, strings.Join(missing, " and "), cfg.Path)
}

// QueueSpecs maps the queues of cfg to the queue layer's specs. Every process that provisions
// the queues (ingresses and workers) derives them from the same file, so they agree.
func QueueSpecs(cfg *config.Config) []queue.Spec {
	replicas := 1
	if cfg.NATS != nil {
		replicas = cfg.NATS.Replicas
	}
	out := make([]queue.Spec, 0, len(cfg.Queues))
	for _, q := range cfg.Queues {
		out = append(out, queue.Spec{
			Name:         q.Name,
			MaxDepth:     q.MaxDepth,
			MaxBodyBytes: q.MaxBodyBytes,
			DedupeWindow: q.DedupeWindow,
			Replicas:     replicas,
			AckWait:      q.AckWait,
			Fair:         q.Fair,
		})
	}
	return out
}
