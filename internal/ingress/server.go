package ingress

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-rl/sluice/internal/config"
)

// DefaultUpstreamTimeout bounds the wait for an upstream's response headers.
const DefaultUpstreamTimeout = 30 * time.Second

// Server is the standalone ingress: a Gate in front of a reverse proxy to the configured
// upstream, plus the job API (POST /v1/queues/{queue}/jobs, GET /v1/jobs/{id}). Its Handler
// is served by an http.Server that the caller runs; set that server's MaxHeaderBytes from the
// config (max_header_bytes) to bound request headers.
//
// A Server is safe for concurrent use, Reload included.
type Server struct {
	gate      *Gate
	echo      *echo.Echo
	proxy     atomic.Pointer[upstream]
	transport http.RoundTripper
	own       *http.Transport // the transport New made, nil when Options.Transport was set
}

// upstream is the reverse proxy to one upstream URL.
type upstream struct {
	url   string
	proxy *httputil.ReverseProxy
}

// New builds a Server for cfg. It returns an error when a rule cannot be used, the
// upstream URL is invalid, or the metrics cannot be registered with opts.Registerer.
func New(cfg *config.Config, opts Options) (*Server, error) {
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	g, err := newGate(cfg, opts, m)
	if err != nil {
		return nil, err
	}
	g.noDefer = isJobAPI
	s := &Server{gate: g, transport: opts.Transport}
	if s.transport == nil {
		timeout := opts.UpstreamTimeout
		if timeout <= 0 {
			timeout = DefaultUpstreamTimeout
		}
		s.own = newTransport(timeout)
		s.transport = s.own
	}
	s.setUpstream(g.rules.Load().upstream)

	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	e.HTTPErrorHandler = s.handleError
	e.Pre(s.front)
	e.POST("/v1/queues/:queue/jobs", s.submitJob)
	e.GET("/v1/jobs/:id", s.getJob)
	s.echo = e
	return s, nil
}

// Handler returns the HTTP handler of the ingress (an *echo.Echo).
func (s *Server) Handler() http.Handler { return s.echo }

// Gate returns the Server's Gate.
func (s *Server) Gate() *Gate { return s.gate }

// Reload applies cfg: its rules, trusted proxies, store timeout, queues and upstream. It is
// atomic: a request is served entirely under the old config or entirely under the new. On
// error the Server keeps its config.
func (s *Server) Reload(cfg *config.Config) error {
	if err := s.gate.Reload(cfg); err != nil {
		return err
	}
	s.setUpstream(s.gate.rules.Load().upstream)
	return nil
}

// Close closes the idle upstream connections of the transport New made.
func (s *Server) Close() {
	if s.own != nil {
		s.own.CloseIdleConnections()
	}
}

func (s *Server) setUpstream(u *url.URL) {
	if u == nil {
		s.proxy.Store(nil)
		return
	}
	if cur := s.proxy.Load(); cur != nil && cur.url == u.String() {
		return
	}
	target := *u
	s.proxy.Store(&upstream{url: u.String(), proxy: &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(&target)
			// Append to the client's chain, as proxies do; Rewrite starts without it.
			if prior := pr.In.Header["X-Forwarded-For"]; len(prior) > 0 {
				pr.Out.Header["X-Forwarded-For"] = append([]string(nil), prior...)
			}
			pr.SetXForwarded()
			appendForwarded(pr)
		},
		Transport:    s.transport,
		ErrorHandler: s.proxyError,
		ErrorLog:     nil,
	}})
}

// newTransport returns a transport for many requests to few hosts: idle keep-alive
// connections enough for high concurrency, and bounded dial and header waits.
func newTransport(headerTimeout time.Duration) *http.Transport {
	return &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          4096,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ExpectContinueTimeout: time.Second,
		ResponseHeaderTimeout: headerTimeout,
	}
}

// appendForwarded keeps the client's Forwarded header (which ReverseProxy drops) and
// appends this hop, as X-Forwarded-For is appended to (RFC 7239 section 4).
func appendForwarded(pr *httputil.ProxyRequest) {
	prior := pr.In.Header["Forwarded"]
	peer, ok := parsePeer(pr.In.RemoteAddr)
	if !ok {
		return
	}
	var b strings.Builder
	for _, p := range prior {
		b.WriteString(p)
		b.WriteString(", ")
	}
	b.WriteString("for=")
	writeNode(&b, peer)
	if h := pr.In.Host; h != "" {
		b.WriteString(";host=")
		b.WriteString(sfString(h)) // a quoted-string; the host holds no quote or backslash
	}
	if pr.In.TLS != nil {
		b.WriteString(";proto=https")
	} else {
		b.WriteString(";proto=http")
	}
	pr.Out.Header["Forwarded"] = []string{b.String()}
}

func writeNode(b *strings.Builder, a netip.Addr) {
	if a.Is6() {
		b.WriteString(`"[`)
		b.WriteString(a.String())
		b.WriteString(`]"`)
		return
	}
	b.WriteString(a.String())
}

// proxyError answers a request the upstream did not answer.
func (s *Server) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the client went away; there is no one to answer
	}
	s.gate.metrics.upstreamErrors.Inc()
	s.gate.log.Warn("ingress: upstream", "method", r.Method, "path", r.URL.Path, "err", err)
	writeProblem(w, problemFor(&upstreamError{err: err}))
}

// front runs before routing, as one middleware (echo builds the pre-routing chain anew for
// every request): decide (which cleans the path first), then forward everything but the
// job API, whatever its method; render errors; count every answer by status.
func (s *Server) front(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		ok, err := s.gate.admit(c)
		if ok {
			if isJobAPI(c.Request().URL.Path) {
				err = next(c)
			} else {
				err = s.forward(c)
			}
		}
		if err != nil {
			c.Error(err)
		}
		s.gate.metrics.countRequest(c.Response().Status)
		return nil
	}
}

var errNoUpstream = &Problem{Type: "about:blank", Title: "No upstream", Status: http.StatusBadGateway,
	Detail: "the ingress has no upstream configured"}

// forward proxies the request to the upstream.
func (s *Server) forward(c echo.Context) error {
	r := c.Request()
	switch {
	case !validMethod(r.Method):
		return badRequest("invalid method", "the request method is not an HTTP token")
	case r.Method == http.MethodConnect || r.Method == http.MethodTrace:
		c.Response().Header().Set("Allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
		return &Problem{Type: "about:blank", Title: "Method not allowed", Status: http.StatusMethodNotAllowed,
			Detail: r.Method + " is not forwarded by this proxy"}
	}
	up := s.proxy.Load()
	if up == nil {
		return errNoUpstream
	}
	up.proxy.ServeHTTP(c.Response(), r)
	return nil
}

func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for i := 0; i < len(m); i++ {
		if !isTokenChar(m[i]) {
			return false
		}
	}
	return true
}

// isJobAPI reports whether path is served by the job API: /v1/jobs/{id} or
// /v1/queues/{queue}/jobs.
func isJobAPI(path string) bool {
	if id, ok := strings.CutPrefix(path, "/v1/jobs/"); ok {
		return id != "" && !strings.Contains(id, "/")
	}
	if rest, ok := strings.CutPrefix(path, "/v1/queues/"); ok {
		name, tail, ok := strings.Cut(rest, "/")
		return ok && name != "" && tail == "jobs"
	}
	return false
}

// handleError is the echo error handler: every error becomes a problem+json answer.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	p := problemFor(err)
	if p.Status == http.StatusInternalServerError {
		s.gate.log.Error("ingress: request", "method", c.Request().Method, "path", c.Request().URL.Path, "err", err)
	}
	writeProblem(c.Response(), p)
}
