// Package admin serves the admin listener (admin_listen) of every Sluice process:
//
//	GET /healthz   200 while the process is up
//	GET /readyz    200 when every check (Redis, NATS) passes, else 503 naming the failures
//	               (and, to holders of the admin token, their errors); it answers from the
//	               checks' latest results, kept in the background (ready.go), never by a
//	               call of its own
//	GET /metrics   Prometheus text format, from the process's registry
//	GET /openapi.json  the OpenAPI document of what this server has mounted (internal/openapi)
//
// and whatever the process mounts with Handle. The ingress mounts the queue reads of [Queues]
// (GET /v1/queues, /v1/queues/{queue}, its tenants and history), the operating API of [Ops]
// (pause, resume, runtime rate, tenant settings, dead letters, job cancel), the regions' leases
// of [Regions] (GET /v1/regions) and the dashboard (/ui/, embedded, no external assets); a
// worker serves the three probes and metrics only.
// It is built on net/http, not echo.
//
// Every request passes two rules first (guard.go): its Host must name the listener (a
// loopback name, its address, or one of admin_hosts), except for the three probes above; and
// a write must not come from another site's page (Origin, Sec-Fetch-Site). Either refusal is
// 403 problem+json. Writes then need the bearer admin_token, or a loopback peer when no token
// is set (401 otherwise); so do finding a tenant by its value, and seeing check errors and
// the workers' hosts and pids (Server.SetToken; others see "unavailable" and ids). Tenants
// are shown by id and label, never by value. Bodies are bounded to 1 MiB and 10 s, answers to 30 s.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/openapi"
)

// Defaults.
const (
	// DefaultCheckTimeout bounds each run of a readiness check.
	DefaultCheckTimeout = 2 * time.Second
	// DefaultShutdownTimeout bounds the graceful shutdown of ListenAndServe.
	DefaultShutdownTimeout = 5 * time.Second
	// DefaultReadTimeout bounds how long a request (header and body) may take to arrive on
	// the admin listener; a stalled body is cut off.
	DefaultReadTimeout = 10 * time.Second
	// DefaultWriteTimeout bounds how long an answer may take to be written, so that a client
	// that never reads does not hold its connection.
	DefaultWriteTimeout = 30 * time.Second
)

// Check is one named readiness check, such as "redis" or "nats". Func returns nil when the
// dependency is usable; it must return soon after ctx is done. It runs in the background
// (ready.go), unless Local.
type Check struct {
	Name string
	Func func(ctx context.Context) error
	// Local marks a check that reads only the process's memory, at no cost: /readyz runs it
	// at each request, so it is never out of date.
	Local bool
}

// RedisCheck checks that rdb answers PING.
func RedisCheck(rdb redis.UniversalClient) Check {
	return Check{Name: "redis", Func: func(ctx context.Context) error { return rdb.Ping(ctx).Err() }}
}

// NATSCheck checks that nc is connected and the server answers a round trip.
func NATSCheck(nc *nats.Conn) Check {
	return Check{Name: "nats", Func: func(ctx context.Context) error {
		if !nc.IsConnected() {
			return errors.New("not connected: " + nc.Status().String())
		}
		return nc.FlushWithContext(ctx)
	}}
}

// Server is the admin HTTP server of one process. Its methods are safe for concurrent use;
// mount handlers with Handle before serving.
type Server struct {
	addr         string
	mux          *http.ServeMux
	checks       []Check
	checkTimeout time.Duration
	// states are the checks' latest results (ready.go), kept by Watch; checkEvery and
	// checkStall are DefaultCheckEvery and DefaultCheckStall, which tests shorten.
	states                 []*checkState
	checkEvery, checkStall time.Duration
	watching               atomic.Bool
	firstRound             startSignal // closed once every check answered once
	reloadErrors           prometheus.Counter
	// readTimeout and writeTimeout are the listener's (Default*Timeout); tests shorten them.
	readTimeout, writeTimeout time.Duration

	mu       sync.Mutex
	routes   []string                          // the patterns mounted; see Routes
	hosts    func() []string                   // admin_hosts; see AllowHosts
	onRefuse func(r *http.Request, why string) // see OnRefuse
	token    string                            // admin_token; see SetToken
}

// SetToken sets the admin token (config admin_token), which the reads that show more than
// a tenant-free summary need, as writes do: the errors of /readyz's and /v1/health's checks
// (they name addresses), the workers' host names and process ids, and finding a tenant by
// its value. "": those go to loopback peers only.
func (s *Server) SetToken(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.token = token
}

// holder reports whether r carries the admin token (or, with none set, comes from a
// loopback peer): whether it may see addresses and host names.
func (s *Server) holder(r *http.Request) bool {
	_, ok := s.authorise(r, "reads of addresses")
	return ok
}

// authorise is the package's authorise with the server's token.
func (s *Server) authorise(r *http.Request, what string) (string, bool) {
	s.mu.Lock()
	tok := s.token
	s.mu.Unlock()
	return authorise(r, tok, what)
}

// New returns an admin server for addr (host:port) that exports reg's metrics and reports
// ready when every check passes. It registers sluice_config_reload_errors_total with reg
// (reusing the counter if reg already has it); nil reg serves an empty /metrics.
func New(addr string, reg *prometheus.Registry, checks ...Check) *Server {
	s := &Server{addr: addr, mux: http.NewServeMux(), checks: checks, checkTimeout: DefaultCheckTimeout,
		checkEvery: DefaultCheckEvery, checkStall: DefaultCheckStall,
		readTimeout: DefaultReadTimeout, writeTimeout: DefaultWriteTimeout}
	for range checks {
		s.states = append(s.states, &checkState{})
	}
	s.reloadErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_config_reload_errors_total",
		Help: "Config reloads that failed (an invalid file, or one that could not be read); the process kept its config.",
	})
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if err := reg.Register(s.reloadErrors); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if c, ok := are.ExistingCollector.(prometheus.Counter); ok {
				s.reloadErrors = c
			}
		}
	}
	s.Handle("GET /healthz", http.HandlerFunc(s.healthz))
	s.Handle("GET /readyz", http.HandlerFunc(s.readyz))
	s.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	s.Handle("GET /openapi.json", s.openAPI())
	return s
}

// Handle mounts h on pattern (an http.ServeMux pattern, such as "GET /v1/queues/{queue}").
// The pattern must be described in the admin OpenAPI document (internal/openapi): a test
// holds every mounted pattern to it.
func (s *Server) Handle(pattern string, h http.Handler) {
	s.mu.Lock()
	s.routes = append(s.routes, pattern)
	s.mu.Unlock()
	s.mux.Handle(pattern, h)
}

// Routes returns the patterns mounted so far, in the order they were mounted.
func (s *Server) Routes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.routes)
}

// openAPI serves the admin OpenAPI document pruned to the routes mounted when it is first
// asked for (every mount happens before serving).
func (s *Server) openAPI() http.Handler {
	doc := sync.OnceValues(func() ([]byte, error) { return openapi.Prune(openapi.Admin(), s.Routes()) })
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := doc()
		if err != nil {
			writeProblem(w, http.StatusInternalServerError, "Internal server error", err.Error())
			return
		}
		openapi.Handler(b).ServeHTTP(w, r)
	})
}

// Handler returns the admin HTTP handler: the mounted handlers behind the Host and origin
// rules (see AllowHosts), with bodies bounded to 1 MiB.
func (s *Server) Handler() http.Handler { return s.guard(s.mux) }

// ReloadFailed counts a config reload that failed, in sluice_config_reload_errors_total.
func (s *Server) ReloadFailed() { s.reloadErrors.Inc() }

// ListenAndServe listens on the server's address and serves until ctx is done, then shuts
// down gracefully (at most DefaultShutdownTimeout) and returns nil. It returns the error of
// listening or serving otherwise.
func (s *Server) ListenAndServe(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return err
	}
	return s.Serve(ctx, ln)
}

// Serve is ListenAndServe on a listener the caller opened; it closes ln. The readiness checks
// run in the background (Watch) while it serves.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() { defer close(watched); s.Watch(wctx) }()
	defer func() { stopWatch(); <-watched }()
	select { // a process asked at once after its start answers from real results
	case <-s.firstRound.ch():
	case <-time.After(firstRoundWait):
	}
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       s.readTimeout,
		WriteTimeout:      s.writeTimeout,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    16 << 10,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readiness is the body of /readyz.
type readiness struct {
	Status string            `json:"status"` // "ok" or "unavailable"
	Checks map[string]string `json:"checks"` // name → "ok", or the error (token holders) or "unavailable"
}

// unavailable is what a check's error reads as to a request without the admin token: errors
// name addresses and host names ("dial tcp 10.0.0.7:6379: connection refused").
const unavailable = "unavailable"

// readyz answers from the checks' latest results (ready.go): it makes no call itself.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	holder := s.holder(r)
	res := readiness{Status: "ok", Checks: make(map[string]string, len(s.checks))}
	for name, err := range s.ready() {
		if err != nil {
			res.Status = unavailable
			res.Checks[name] = unavailable
			if holder {
				res.Checks[name] = err.Error()
			}
		} else {
			res.Checks[name] = "ok"
		}
	}
	code := http.StatusOK
	if res.Status != "ok" {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, res)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	w.Write(append(body, '\n'))
}

// Exposed reports whether the admin listener at addr is reachable from other hosts (its host
// is not a loopback address or "localhost") while token is empty: then the admin API's writes
// are refused to every peer but loopback ones, and its reads — queue names, depths, metrics —
// are open to the network. The processes log a warning for it at start.
func Exposed(addr, token string) bool {
	if token != "" {
		return false
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return true
	}
	if host == "localhost" {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err != nil || !ip.IsLoopback()
}

// startSignal is a channel closed once, lazily made.
type startSignal struct {
	once, closed sync.Once
	c            chan struct{}
}

func (s *startSignal) ch() chan struct{} {
	s.once.Do(func() { s.c = make(chan struct{}) })
	return s.c
}

func (s *startSignal) close() { s.closed.Do(func() { close(s.ch()) }) }
