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
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/inflight"
	"github.com/sluice-rl/sluice/internal/admin"
	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/connect"
	"github.com/sluice-rl/sluice/internal/demo"
	"github.com/sluice-rl/sluice/internal/ingress"
	"github.com/sluice-rl/sluice/internal/regions"
	"github.com/sluice-rl/sluice/internal/rls"
	"github.com/sluice-rl/sluice/internal/tracing"
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

	// routes, if set, is told the routes of the job API and of the admin listener once the
	// process serves requests (for the test that holds them to the OpenAPI documents).
	routes func(public, admin []string)
}

// Run serves until ctx ends, then stops accepting, lets requests and deliveries in flight
// finish within the config's shutdown_timeout, and returns nil. It returns a connect.ErrConfig
// error for an unusable config and other errors, naming the service, when a listener cannot be
// opened, the queues cannot be set up or a listener fails while serving.
func (m Ingress) Run(ctx context.Context) error {
	cfg, err := config.Load(m.ConfigPath)
	if err != nil {
		return connect.ConfigError(err)
	}
	p := &ingressProc{Ingress: m, log: logger(m.Logger), reg: newRegistry()}
	p.late = newLateQueues(p.log)
	p.current.Store(cfg)
	lc := newLifecycle("ingress", p.log)
	p.lc = lc
	defer func() { lc.stop(p.current.Load().ShutdownTimeout); p.log.Info("ingress: stopped") }()
	if err := lc.start(ctx, p.services(lc, cfg)...); err != nil {
		return startErr(ctx, err)
	}
	p.log.Info("ingress: listening", "addr", p.ln.Addr().String(), "admin", p.adminLn.Addr().String(),
		"rules", len(cfg.Rules), "queues", len(cfg.Queues), "redis", cfg.Redis != nil)
	if m.routes != nil {
		m.routes(p.srv.Routes(), p.adm.Routes())
	}
	if m.Ready != nil {
		m.Ready(p.ln.Addr().String(), p.adminLn.Addr().String())
	}
	err = lc.wait(ctx)
	p.log.Info("ingress: shutting down", "timeout", p.current.Load().ShutdownTimeout)
	return err
}

// ingressProc is one run of the ingress: what its services share.
type ingressProc struct {
	Ingress
	log *slog.Logger
	reg *prometheus.Registry
	// coordinator is the connection to the regions' coordinator; nil without regions.
	coordinator *nats.Conn
	holder      *regions.Holder // the region's leases of the global rules; nil without regions
	// shownHolder is holder for the metrics' scrapes (ruleLeaseMetrics), registered once.
	shownHolder atomic.Pointer[regions.Holder]
	ruleMetrics sync.Once
	current     atomic.Pointer[config.Config]
	lc          *lifecycle // stops the process when the queues can never open (startQueues)

	rdb      redis.UniversalClient
	lim      limit.Limiter   // nil: in-process memory (ingress.New's default)
	places   *inflight.Redis // concurrency rules' places; nil: in-process memory
	schedule leaky.Schedule
	// queuePlaces are the concurrency places of the queues' deliveries (max_in_flight), which
	// the admin API shows and the quickstart's in-process workers take: in Redis, shared with
	// standalone workers, or in memory.
	queuePlaces inflight.Store
	ens         *embeddedNATS // the quickstart's NATS server; nil with a nats section
	nc          *nats.Conn
	js          jetstream.JetStream
	checks      []admin.Check
	late        *lateQueues   // what the rules and the admin API use: answers 503 until qs opens
	qs          *queue.Queues // set once open (at start with the embedded server)
	opening     chan struct{} // closed when the background opening of the queues ends
	stopOpen    context.CancelFunc
	provMu      sync.Mutex     // provisioning: a reload's and the opening's
	pending     *config.Config // a reload applied before the queues opened
	srv         *ingress.Server
	pool        *worker.Pool // drains the embedded server's queues; nil with a nats section
	// pooled is pool for the history sampler, which starts before the pool is made.
	pooled  atomic.Pointer[worker.Pool]
	ln      net.Listener
	adminLn net.Listener
	demoLn  net.Listener // nil without demo_upstream
	adm     *admin.Server
	history *admin.History // the queues' last hour, sampled by the "history" service
	rls     *rls.Server    // the Envoy rate-limit service; nil without rls_listen
	rlsLn   net.Listener
	tr      *tracing.Tracer // nil: tracing off
}

// services are the ingress's services, in the order they start (see the package doc).
func (p *ingressProc) services(lc *lifecycle, cfg *config.Config) []service {
	s := []service{tracingService(&p.tr, cfg, "ingress", p.log), {name: "redis", start: p.startRedis, stop: p.stopRedis}}
	if cfg.NATS == nil {
		s = append(s, service{name: "embedded nats", start: p.startEmbedded, stop: p.stopEmbedded})
	}
	s = append(s,
		service{name: "nats", start: p.startNATS, stop: p.stopNATS},
		// With a nats section the queues open in the background: the listeners serve (forward,
		// 429, and 503 for deferrals) while NATS does not answer.
		service{name: "queues", start: p.startQueues, stop: p.stopQueues},
		service{name: "regions coordinator", start: p.connectCoordinator, stop: p.closeCoordinator},
		service{name: "rules", start: p.startRules, stop: p.stopRules},
		// Listeners before anything serves, so that a taken port is reported first.
		service{name: "listen", start: p.listen, stop: p.closeListeners},
		service{name: "admin api", start: p.mountAdmin},
		lc.run("admin listener", background{}, func(ctx context.Context) error { return p.adm.Serve(ctx, p.adminLn) }),
		lc.run("history", background{optional: true}, func(ctx context.Context) error { return p.history.Run(ctx) }),
	)
	if cfg.DemoUpstream != "" {
		s = append(s, lc.run("demo upstream", background{}, p.serveDemo))
	}
	if cfg.Regions != nil && cfg.Region != "" {
		s = append(s, lc.run("rule leases", background{optional: true}, func(ctx context.Context) error {
			if p.holder == nil {
				<-ctx.Done()
				return nil
			}
			return p.holder.Run(ctx)
		}))
	}
	if cfg.RLSListen != "" {
		s = append(s, p.rlsServices(lc)...)
	}
	if cfg.NATS == nil {
		// Nothing outside this process can reach an embedded server's queues.
		s = append(s, service{name: "worker pool", start: p.newPool},
			lc.run("in-process workers", background{drainsFirst: true}, p.runPool),
			lc.run("embedded store", background{optional: true}, func(ctx context.Context) error {
				return p.ens.watchStore(ctx, p.log)
			}),
			lc.run("leftovers", background{optional: true}, func(ctx context.Context) error {
				return removeLeftovers(ctx, p.qs, p.nc, p.current.Load, p.late.breaker.fix, p.log)
			}))
	}
	return append(s,
		lc.run("config watcher", background{optional: true}, p.watch),
		p.public(lc),
	)
}

// startRedis connects the limiter store and the leak schedule: Redis when configured, else
// memory.
func (p *ingressProc) startRedis(ctx context.Context) error {
	cfg := p.current.Load()
	if cfg.Redis == nil {
		if cfg.NATS != nil {
			p.log.Warn("ingress: a nats section without redis: no worker drains these queues (standalone workers need redis for the "+
				"shared leak schedule, and this ingress runs none of its own): deferred jobs are accepted and wait; add a redis "+
				"section (or SLUICE_REDIS_URL) and run cmd/worker, or drop nats to run the quickstart's in-process workers. "+
				"sluice_queue_consumers counts the workers of each queue", "queues", len(cfg.Queues))
		}
		p.schedule = leaky.NewMemory(nil)
		p.queuePlaces = inflight.NewMemory()
		return nil
	}
	connect.RouteRedisLogs(p.log)
	rdb, err := connect.Redis(cfg.Redis.URL)
	if err != nil {
		return connect.ConfigError(fmt.Errorf("%s: redis.url: %w", cfg.Path, err))
	}
	if err := refuseEviction(ctx, rdb, cfg.Path, p.log); err != nil {
		_ = rdb.Close() // a service that fails to start is not stopped
		return err
	}
	p.rdb = rdb
	p.lim = limit.NewRedis(rdb, limit.RedisConfig{OnLoss: ruleLosses(p.reg, p.log)})
	lost := inflight.WithOnLoss(placeLosses(p.reg, p.log, "ingress"))
	p.places = inflight.NewRedis(rdb, inflight.WithPrefix(placesPrefix), lost)
	p.schedule = leaky.NewRedis(rdb, leaky.RedisConfig{})
	p.queuePlaces = inflight.NewRedis(rdb, inflight.WithMargin(worker.PlaceMargin), lost)
	p.checks = append(p.checks, admin.RedisCheck(rdb), evictionCheck(rdb))
	return nil
}

func (p *ingressProc) stopRedis(context.Context) error {
	if p.rdb == nil {
		return nil
	}
	if r, ok := p.queuePlaces.(*inflight.Redis); ok {
		r.Close()
	}
	if p.places != nil {
		p.places.Close() // its subscription, if a Wait started one; never an error worth reporting
	}
	return p.rdb.Close()
}

// placesPrefix starts the Redis keys of the ingress's concurrency places: apart from the
// workers' in-flight places, so neither shares a key or a release channel with the other.
const placesPrefix = inflight.DefaultPrefix + "rule:"

// startEmbedded starts the quickstart's NATS server, in-process.
func (p *ingressProc) startEmbedded(context.Context) error {
	ens, err := startEmbeddedNATS(p.current.Load().DataDir)
	if errors.Is(err, errNoEmbedded) {
		return connect.ConfigError(fmt.Errorf("%s: %w", p.ConfigPath, err))
	}
	if err != nil {
		return err
	}
	p.ens = ens
	p.late.breaker.fix = "free space under data_dir (" + ens.storeDir() + "), then restart the ingress: its embedded JetStream keeps the write error until it starts again"
	p.log.Info("ingress: embedded NATS with JetStream", "store", ens.storeDir())
	return nil
}

func (p *ingressProc) stopEmbedded(context.Context) error { p.ens.stop(); return nil }

// startNATS connects to the embedded server or to the configured ones.
func (p *ingressProc) startNATS(context.Context) error {
	var err error
	if p.ens != nil {
		p.nc, err = p.ens.connect()
	} else {
		p.nc, err = connect.NATS(p.current.Load().NATS.URL, "sluice-ingress", p.log)
	}
	if err != nil {
		return err
	}
	js, err := newJetStream(p.nc, p.current.Load())
	if err != nil {
		return err
	}
	p.js = js
	nc := p.nc
	p.late.breaker.reconnects = func() uint64 { return nc.Stats().Reconnects }
	p.checks = append(p.checks, admin.NATSCheck(p.nc), jetStreamCheck(js, p.late.ready))
	return nil
}

func (p *ingressProc) stopNATS(context.Context) error { p.nc.Close(); return nil }

// startQueues opens and provisions the queues: at once with the embedded server, which
// answers; else in the background, once NATS answers (p.late answers 503 until then).
func (p *ingressProc) startQueues(ctx context.Context) error {
	cfg := p.current.Load()
	if p.ens != nil {
		qs, err := openQueues(ctx, "ingress", p.js, "embedded", p.current.Load, p.log, nil)
		if err != nil {
			return err
		}
		p.qs = qs
		p.late.open(qs)
		return nil
	}
	octx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.stopOpen, p.opening = cancel, make(chan struct{})
	go func() {
		defer close(p.opening)
		qs, err := openQueues(octx, "ingress", p.js, cfg.NATS.URL, p.current.Load, p.log, p.late.failed)
		if err != nil {
			if octx.Err() == nil { // a permanent misconfiguration (explainOpen): stop, saying so
				p.late.failed(err)
				p.lc.fail("queues", err)
			}
			return // or stopped before NATS answered
		}
		p.provMu.Lock()
		defer p.provMu.Unlock()
		if p.pending != nil {
			if err := qs.Provision(octx, QueueSpecs(p.pending)); err != nil {
				p.log.Warn("ingress: provision the queues of the config reloaded before they opened", "err", err)
			}
		}
		p.qs = qs
		p.late.open(qs)
		p.log.Info("ingress: queues open; deferring", "queues", len(p.current.Load().Queues))
	}()
	return nil
}

// provisionQueues is the reload step "provision queues": provision next's queues, or, before
// they open, have the opening provision them.
func (p *ingressProc) provisionQueues(ctx context.Context, next *config.Config) error {
	p.provMu.Lock()
	defer p.provMu.Unlock()
	qs := p.late.qs.Load()
	if qs == nil {
		p.pending = next
		return nil
	}
	return qs.Provision(ctx, QueueSpecs(next))
}

// stopQueues ends the opening if NATS never answered, then lets the withdrawals of jobs stored
// after their 503 (queue: retract) finish, within the shutdown budget.
func (p *ingressProc) stopQueues(ctx context.Context) error {
	if p.stopOpen != nil {
		p.stopOpen()
		<-p.opening
	}
	if p.qs == nil {
		return nil
	}
	if err := p.qs.Close(ctx); err != nil {
		return fmt.Errorf("stopped before withdrawing every job stored after its 503: %w", err)
	}
	return nil
}

// startRules builds the front: rules, limits, forwarding and the job API.
func (p *ingressProc) startRules(context.Context) error {
	opts := ingress.Options{Limiter: p.lim, Enqueuer: p.late, Registerer: p.reg, Logger: p.log,
		Drain: drainOf(p.late.Control, p.schedule, p.current.Load), Tracer: p.tr}
	if p.places != nil { // a nil *inflight.Redis is not a nil Store
		opts.Places = p.places
	}
	if p.holder = p.ruleLeases(); p.holder != nil {
		opts.RegionalLimit = p.regionalLimit
	}
	p.shownHolder.Store(p.holder)
	p.ruleMetrics.Do(func() { p.reg.MustRegister(ruleLeaseMetrics{holder: p.shownHolder.Load}) })
	srv, err := ingress.New(p.current.Load(), opts)
	if err != nil {
		return connect.ConfigError(err)
	}
	p.srv = srv
	return nil
}

func (p *ingressProc) stopRules(context.Context) error { p.srv.Close(); return nil }

// listen opens the public, admin and (when configured) demo listeners, all or none.
func (p *ingressProc) listen(context.Context) error {
	cfg := p.current.Load()
	var err error
	if p.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return err
	}
	if p.adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
		p.ln.Close()
		return fmt.Errorf("admin_listen: %w", err)
	}
	if cfg.DemoUpstream != "" {
		if p.demoLn, err = net.Listen("tcp", cfg.DemoUpstream); err != nil {
			p.ln.Close()
			p.adminLn.Close()
			return fmt.Errorf("demo_upstream: %w", err)
		}
	}
	return nil
}

// closeListeners closes the listeners that no server took over (a start that failed after
// listen); closing one a server has closed does nothing.
func (p *ingressProc) closeListeners(context.Context) error {
	for _, ln := range []net.Listener{p.ln, p.adminLn, p.demoLn} {
		if ln != nil {
			ln.Close()
		}
	}
	return nil
}

// mountAdmin builds the admin API: health, readiness, metrics, queue reads and the operating
// API.
func (p *ingressProc) mountAdmin(context.Context) error {
	cfg := p.current.Load()
	if admin.Exposed(cfg.AdminListen, cfg.AdminToken) {
		p.log.Warn("ingress: admin_listen is reachable from other hosts and no admin_token is set: anyone who reaches it reads queue state and metrics; set admin_token (or SLUICE_ADMIN_TOKEN) or bind it to 127.0.0.1", "admin_listen", cfg.AdminListen)
	}
	p.adm = admin.New(cfg.AdminListen, p.reg, p.checks...)
	p.adm.SetToken(cfg.AdminToken)
	queues := &admin.Queues{
		Info:        p.late,
		Config:      p.current.Load,
		PausedUntil: pausedUntil(p.schedule),
		Controls:    p.late.QueueControls,
		Tenant:      p.late.Tenant,
		TenantID:    p.late.TenantID,
		Places:      queuePlaces(p.queuePlaces),
	}
	queues.TenantControl, queues.TenantCounts = p.late.TenantControl, p.late.TenantCounts
	if tp, ok := p.schedule.(leaky.TenantPauses); ok {
		queues.PausedTenants = tp.PausedTenants
	}
	if ad, ok := p.schedule.(leaky.Adapter); ok {
		queues.Learned = ad.Learned
	}
	queues.Mount(p.adm)
	(&admin.Regions{Config: p.current.Load, Read: p.readRegions}).Mount(p.adm)
	cm := &consumersMetric{
		js: func() jetstream.JetStream {
			if p.late.qs.Load() == nil {
				return nil
			}
			return p.js
		},
		current: p.current.Load, inProcess: cfg.NATS == nil,
	}
	p.reg.MustRegister(queues.Metrics(), cm)
	p.mountOperating(queues, cm)
	ops := &admin.Ops{Q: p.late, Queues: queues, Token: cfg.AdminToken, Logger: p.log, Gatherer: p.reg}
	return ops.Mount(p.adm, p.reg)
}

// serveDemo serves the quickstart's demo upstream until ctx ends.
func (p *ingressProc) serveDemo(ctx context.Context) error {
	srv := &http.Server{Handler: demo.Handler(p.log), ReadHeaderTimeout: 10 * time.Second}
	context.AfterFunc(ctx, func() { srv.Close() })
	p.log.Info("ingress: demo upstream", "addr", p.demoLn.Addr().String())
	return srv.Serve(p.demoLn)
}

// newPool builds the in-process worker pool of the embedded server's queues.
func (p *ingressProc) newPool(context.Context) error {
	cfg := p.current.Load()
	reg, err := leaseDeps(cfg, p.coordinator)
	if err != nil {
		return err
	}
	pool, err := worker.New(worker.Deps{
		Regions: reg,
		Queues:  p.qs, Schedule: p.schedule, Places: p.queuePlaces, Registerer: p.reg, Logger: p.log,
		ShutdownTimeout: cfg.ShutdownTimeout, Tracer: p.tr,
	}, worker.FromConfig(cfg, p.qs.TenantID))
	if err != nil {
		return connect.ConfigError(err)
	}
	pool.SetDirectHTTP(!cfg.Worker.NetHTTPOnly)
	p.pool = pool
	p.pooled.Store(pool)
	return nil
}

func (p *ingressProc) runPool(ctx context.Context) error {
	p.log.Info("ingress: in-process workers drain the queues", "queues", len(p.current.Load().Queues))
	return p.pool.Run(ctx)
}

// watch reloads the config on SIGHUP and on file change, by the one reload policy.
func (p *ingressProc) watch(ctx context.Context) error {
	steps := []reloadStep{{"provision queues", p.provisionQueues}}
	if p.rls != nil {
		steps = append(steps, p.rlsStep())
	}
	steps = append(steps, reloadStep{"rules", func(_ context.Context, next *config.Config) error { return p.srv.Reload(next) }})
	if p.holder != nil {
		steps = append(steps, reloadStep{"rule leases", func(_ context.Context, next *config.Config) error {
			p.holder.Set(ruleBudgets(next))
			return nil
		}})
	}
	if p.pool != nil {
		steps = append(steps, reloadStep{"worker pool", func(_ context.Context, next *config.Config) error {
			if err := p.pool.Reload(worker.FromConfig(next, p.qs.TenantID)); err != nil {
				return err
			}
			p.pool.SetDirectHTTP(!next.Worker.NetHTTPOnly)
			return nil
		}})
	}
	r := &reloader{proc: "ingress", log: p.log, failed: p.adm.ReloadFailed, current: &p.current, steps: steps}
	return r.watcher(ctx, p.ConfigPath).Run(ctx)
}

// public serves the public listener. Its stop lets the requests in flight finish within the
// shutdown budget, then cuts the rest off.
func (p *ingressProc) public(lc *lifecycle) service {
	cfg := p.current.Load()
	var srv *http.Server
	serve := lc.run("listener", background{}, func(context.Context) error { return srv.Serve(p.ln) })
	return service{
		name: serve.name,
		start: func(ctx context.Context) error {
			srv = &http.Server{
				Handler:           p.srv.Handler(),
				MaxHeaderBytes:    cfg.MaxHeaderBytes,
				ReadHeaderTimeout: 10 * time.Second,
				ReadTimeout:       cfg.ReadTimeout, // the body too: a stalled one is cut off, 408
				IdleTimeout:       2 * time.Minute,
			}
			return serve.start(ctx)
		},
		stop: func(ctx context.Context) error {
			err := srv.Shutdown(ctx)
			if err != nil {
				srv.Close()
				err = fmt.Errorf("requests still in flight at the shutdown timeout: %w", err)
			}
			serve.stop(ctx)
			return err
		},
	}
}

// logger is l, or text to stderr.
func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return l
}

// newRegistry is a process's metrics registry, with the Go runtime's and the process's.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// startErr is what Run returns for a start that failed with err: nil when ctx ended meanwhile
// (the process was told to stop while it waited for NATS), else err.
func startErr(ctx context.Context, err error) error {
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil
	}
	return err
}

// queuePlaces reads the places held by a queue's deliveries, and by one tenant's, from s.
func queuePlaces(s inflight.Store) func(ctx context.Context, queue, tenant string) (int64, int64, error) {
	return func(ctx context.Context, queue, tenant string) (int64, int64, error) {
		keys := worker.PlaceKeys(queue, tenant)
		n, err := s.InFlight(ctx, keys...)
		if err != nil {
			return 0, 0, err
		}
		if len(n) < 2 {
			return n[0], 0, nil
		}
		return n[0], n[1], nil
	}
}
