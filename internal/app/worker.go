package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/inflight"
	"github.com/sluice-rl/sluice/internal/admin"
	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/connect"
	"github.com/sluice-rl/sluice/internal/tracing"
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
// returns nil. It returns a connect.ErrConfig error for an unusable config, and other errors,
// naming the service, when the admin listener cannot be opened or fails, or the queues cannot
// be provisioned.
func (m Worker) Run(ctx context.Context) error {
	cfg, err := config.Load(m.ConfigPath)
	if err != nil {
		return configErr(err)
	}
	if err := needsStores(cfg); err != nil {
		return err
	}
	p := &workerProc{Worker: m, log: logger(m.Logger), reg: newRegistry()}
	p.current.Store(cfg)
	lc := newLifecycle("worker", p.log)
	defer func() { lc.stop(p.current.Load().ShutdownTimeout); p.log.Info("worker: stopped") }()
	if err := lc.start(ctx, p.services(lc)...); err != nil {
		return startErr(ctx, err)
	}
	// Ready once every queue's runner has its consumer: a job published now is fetched.
	select {
	case <-p.pool.Started():
	case <-ctx.Done():
		return nil
	case err := <-lc.failed:
		return err
	}
	p.draining.Store(true)
	p.log.Info("worker: draining", "queues", len(cfg.Queues), "nats", connect.RedactURL(cfg.NATS.URL))
	if m.Ready != nil {
		m.Ready(p.ln.Addr().String())
	}
	err = lc.wait(ctx)
	p.draining.Store(false)
	return err
}

// workerProc is one run of the worker: what its services share.
type workerProc struct {
	Worker
	log *slog.Logger
	reg *prometheus.Registry
	// coordinator is the connection to the regions' coordinator; nil without regions.
	coordinator *nats.Conn
	current     atomic.Pointer[config.Config]
	draining    atomic.Bool                 // the pool runs: /readyz's "worker" check
	waiting     atomic.Pointer[string]      // why the queues are not open yet, for that check
	pooled      atomic.Pointer[worker.Pool] // pool, for that check before draining is set

	rdb    redis.UniversalClient
	places *inflight.Redis // the concurrency places, on rdb
	nc     *nats.Conn
	js     jetstream.JetStream
	ln     net.Listener
	adm    *admin.Server
	qs     *queue.Queues
	pool   *worker.Pool
	tr     *tracing.Tracer // nil: tracing off
}

// services are the worker's services, in the order they start (see the package doc). The
// admin listener is up before the queues, so that /readyz tells why the worker does not
// drain yet while NATS is down.
func (p *workerProc) services(lc *lifecycle) []service {
	return []service{
		tracingService(&p.tr, p.current.Load(), "worker", p.log),
		{name: "redis", start: p.startRedis, stop: func(context.Context) error { p.places.Close(); return p.rdb.Close() }},
		{name: "nats", start: p.startNATS, stop: func(context.Context) error { p.nc.Close(); return nil }},
		{name: "admin api", start: p.startAdmin, stop: func(context.Context) error { p.ln.Close(); return nil }},
		lc.run("admin listener", background{}, func(ctx context.Context) error { return p.adm.Serve(ctx, p.ln) }),
		{name: "queues", start: p.startQueues, stop: func(ctx context.Context) error { return p.qs.Close(ctx) }},
		{name: "worker pool", start: p.newPool, stop: p.closeCoordinator},
		lc.run("workers", background{drainsFirst: true}, func(ctx context.Context) error { return p.pool.Run(ctx) }),
		lc.run("leftovers", background{optional: true}, func(ctx context.Context) error {
			return removeLeftovers(ctx, p.qs, p.nc, p.current.Load, fixRestart, p.log)
		}),
		lc.run("presence", background{optional: true}, func(ctx context.Context) error {
			return presence(ctx, p.js, p.current.Load, p.pool.Answers, p.log)
		}),
		lc.run("config watcher", background{optional: true}, p.watch),
	}
}

// startRedis connects to the Redis of the leak schedule.
func (p *workerProc) startRedis(ctx context.Context) error {
	cfg := p.current.Load()
	connect.RouteRedisLogs(p.log)
	rdb, err := connect.Redis(cfg.Redis.URL)
	if err != nil {
		return configErrf("%s: redis.url: %w", cfg.Path, err)
	}
	// A Redis refused at start is closed here: a service that fails to start is not stopped.
	if err := refuseEviction(ctx, rdb, cfg.Path, p.log); err != nil {
		_ = rdb.Close()
		return err
	}
	p.rdb = rdb
	p.places = inflight.NewRedis(rdb, inflight.WithMargin(worker.PlaceMargin),
		inflight.WithOnLoss(placeLosses(p.reg, p.log, "worker")))
	for _, w := range cfg.Warnings() {
		p.log.Warn("worker: " + w)
	}
	return nil
}

// startNATS connects to NATS. The connection retries in the background, so the worker starts
// (and reports not ready) while NATS is down.
func (p *workerProc) startNATS(context.Context) error {
	var err error
	if p.nc, err = connect.NATS(p.current.Load().NATS.URL, "sluice-worker", p.log); err != nil {
		return err
	}
	p.js, err = newJetStream(p.nc, p.current.Load())
	return err
}

// startAdmin opens the admin listener: health, readiness (Redis, NATS, and whether the pool
// drains and reaches its leak schedule) and metrics.
func (p *workerProc) startAdmin(context.Context) error {
	cfg := p.current.Load()
	if admin.Exposed(cfg.AdminListen, cfg.AdminToken) {
		p.log.Warn("worker: admin_listen is reachable from other hosts and no admin_token is set: anyone who reaches it reads queue state and metrics; set admin_token (or SLUICE_ADMIN_TOKEN) or bind it to 127.0.0.1", "admin_listen", cfg.AdminListen)
	}
	p.adm = admin.New(cfg.AdminListen, p.reg,
		admin.Check{Name: "worker", Func: func(context.Context) error {
			if !p.draining.Load() {
				if why := p.waiting.Load(); why != nil {
					return fmt.Errorf("not draining: %s", *why)
				}
				if pl := p.pooled.Load(); pl != nil {
					if err := pl.Ready(); err != nil {
						return fmt.Errorf("not draining yet: %w", err)
					}
				}
				return errors.New("not draining")
			}
			// Set before draining was: the leak schedule's health, as the pool sees it.
			return p.pool.Ready()
		}, Local: true}, // the pool's own state, read at each request
		admin.RedisCheck(p.rdb), admin.NATSCheck(p.nc), jetStreamCheck(p.js, nil))
	p.adm.SetToken(cfg.AdminToken)
	var err error
	if p.ln, err = net.Listen("tcp", cfg.AdminListen); err != nil {
		return err
	}
	p.log.Info("worker: admin listening", "addr", p.ln.Addr().String())
	return nil
}

// startQueues opens and provisions the queues, once NATS answers.
func (p *workerProc) startQueues(ctx context.Context) error {
	var err error
	p.qs, err = openQueues(ctx, "worker", p.js, p.current.Load().NATS.URL, p.current.Load, p.log, func(err error) {
		why := "queues unavailable: " + err.Error()
		p.waiting.Store(&why)
	})
	return err
}

// newPool builds the pool that drains the queues, on the leak schedule in Redis.
func (p *workerProc) newPool(context.Context) error {
	cfg := p.current.Load()
	reg, coord, err := regionsDeps(cfg, p.log)
	if err != nil {
		return err
	}
	p.coordinator = coord
	pool, err := worker.New(worker.Deps{
		Regions:         reg,
		Queues:          p.qs,
		Schedule:        leaky.NewRedis(p.rdb, leaky.RedisConfig{}),
		Places:          p.places,
		Registerer:      p.reg,
		Logger:          p.log,
		ShutdownTimeout: cfg.ShutdownTimeout,
		Tracer:          p.tr,
	}, worker.FromConfig(cfg, p.qs.TenantID))
	if err != nil {
		return configErr(err)
	}
	pool.SetDirectHTTP(!cfg.Worker.NetHTTPOnly)
	p.pool = pool
	p.pooled.Store(pool)
	return nil
}

// watch reloads the config on SIGHUP and on file change, by the one reload policy: the
// queues are provisioned first, so that new queues have their consumer when the pool starts on
// them.
func (p *workerProc) watch(ctx context.Context) error {
	r := &reloader{proc: "worker", log: p.log, failed: p.adm.ReloadFailed, current: &p.current, steps: []reloadStep{
		{"provision queues", func(ctx context.Context, next *config.Config) error { return p.qs.Provision(ctx, QueueSpecs(next)) }},
		{"worker pool", func(_ context.Context, next *config.Config) error {
			if err := p.pool.Reload(worker.FromConfig(next, p.qs.TenantID)); err != nil {
				return err
			}
			p.pool.SetDirectHTTP(!next.Worker.NetHTTPOnly)
			return nil
		}},
	}}
	return r.watcher(ctx, p.ConfigPath).Run(ctx)
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
