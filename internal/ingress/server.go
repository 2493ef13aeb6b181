package ingress

import (
	"cmp"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/openapi"
	"github.com/sluice-rl/sluice/internal/tracing"
)

// DefaultUpstreamTimeout bounds the wait for an upstream's response headers.
const DefaultUpstreamTimeout = 30 * time.Second

// Server is the standalone ingress: a gate in front of a reverse proxy to the configured
// upstream, plus the job API (POST /v1/queues/{queue}/jobs, GET /v1/jobs/{id}). Its Handler
// is served by an http.Server that the caller runs; set that server's MaxHeaderBytes from the
// config (max_header_bytes) to bound request headers.
//
// A Server is safe for concurrent use, Reload included.
type Server struct {
	gate      *gate
	echo      *echo.Echo // routes the job API and renders its errors
	proxy     atomic.Pointer[upstream]
	transport http.RoundTripper
	own       *http.Transport // the transport New made, nil when Options.Transport was set
	writers   sync.Pool       // *forwardWriter
	// writeStall is the config's read_timeout, in ns: how long one write of a forwarded
	// answer may wait for the client to read.
	writeStall atomic.Int64
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
	g.warn(cfg)
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
	s.writeStall.Store(int64(cfg.ReadTimeout))
	m.readAhead.bound.Store(cmp.Or(cfg.ReadAheadBytes, config.DefaultReadAheadBytes))

	s.writers.New = func() any { return new(forwardWriter) }
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	e.HTTPErrorHandler = s.handleError
	e.POST("/v1/queues/:queue/jobs", s.submitJob)
	e.GET("/v1/jobs/:id", s.getJob)
	e.GET(openAPIPath, echo.WrapHandler(openapi.Handler(openapi.Job())))
	s.echo = e
	return s, nil
}

// Handler returns the HTTP handler of the ingress: the Server itself.
func (s *Server) Handler() http.Handler { return s }

// Reload applies cfg: its rules, trusted proxies, store timeout, queues and upstream. It is
// atomic: a request is served entirely under the old config or entirely under the new. On
// error the Server keeps its config.
func (s *Server) Reload(cfg *config.Config) error {
	if err := s.gate.reload(cfg); err != nil {
		return err
	}
	s.gate.warn(cfg)
	s.setUpstream(s.gate.rules.Load().upstream)
	s.writeStall.Store(int64(cfg.ReadTimeout))
	s.gate.metrics.readAhead.bound.Store(cmp.Or(cfg.ReadAheadBytes, config.DefaultReadAheadBytes))
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
			rewrite(pr, &target)
			if s.gate.tr.On() {
				tracing.Inject(pr.Out.Context(), pr.Out.Header)
			}
		},
		Transport:      s.transport,
		BufferPool:     copyBuffers{},
		ModifyResponse: debtCutter,
		ErrorHandler:   s.proxyError,
		ErrorLog:       nil,
	}})
}

// rewrite points the outbound request at target and sets the forwarding headers:
// X-Forwarded-For appended to the client's chain, X-Forwarded-Host, X-Forwarded-Proto (as
// ProxyRequest.SetXForwarded does, but with the client's chain kept) and Forwarded appended
// to (appendForwarded). The header values share one allocation.
func rewrite(pr *httputil.ProxyRequest, target *url.URL) {
	pr.SetURL(target)
	setForwarding(pr.Out.Header, pr.In)
}

// setForwarding sets in h the forwarding headers of a request in that this hop passes on.
// A client's X-Real-IP and True-Client-IP are dropped (see scrub.go).
func setForwarding(h http.Header, in *http.Request) {
	delete(h, "X-Real-Ip")
	delete(h, "True-Client-Ip")
	vals := make([]string, 4)
	if host, _, err := net.SplitHostPort(in.RemoteAddr); err == nil {
		if prior := in.Header["X-Forwarded-For"]; len(prior) > 0 {
			host = strings.Join(prior, ", ") + ", " + host
		}
		vals[0] = host
		h["X-Forwarded-For"] = vals[0:1:1]
	}
	vals[1] = in.Host
	h["X-Forwarded-Host"] = vals[1:2:2]
	vals[2] = "http"
	if in.TLS != nil {
		vals[2] = "https"
	}
	h["X-Forwarded-Proto"] = vals[2:3:3]
	var buf [128]byte
	if b, ok := appendForwarded(buf[:0], in); ok {
		vals[3] = string(b)
		h["Forwarded"] = vals[3:4:4]
	}
}

// copyBuffers is the ReverseProxy's BufferPool: 32 KiB buffers for copying response bodies,
// which it would otherwise allocate for every request.
type copyBuffers struct{}

const copyBufferSize = 32 << 10

var copyBufferPool = sync.Pool{New: func() any { return new([copyBufferSize]byte) }}

func (copyBuffers) Get() []byte { return copyBufferPool.Get().(*[copyBufferSize]byte)[:] }
func (copyBuffers) Put(b []byte) {
	if cap(b) >= copyBufferSize {
		copyBufferPool.Put((*[copyBufferSize]byte)(b[:copyBufferSize]))
	}
}

// newTransport returns a transport for many requests to few hosts: idle keep-alive
// connections enough for high concurrency, and bounded dial and header waits. It leaves
// encodings alone: the client's Accept-Encoding goes to the upstream as it is (the default
// transport would add gzip to requests without one and decompress the answer, costing CPU
// and turning a sized response into a streamed, flushed-per-write one).
func newTransport(headerTimeout time.Duration) *http.Transport {
	return &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true, // for https upstreams; plain http ones are HTTP/1.1 either way
		DisableCompression:    true,
		MaxIdleConns:          4096,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ExpectContinueTimeout: time.Second,
		ResponseHeaderTimeout: headerTimeout,
	}
}

// appendForwarded appends the Forwarded header of the outbound request to dst: the client's
// Forwarded header (which ReverseProxy drops) with this hop appended, as X-Forwarded-For is
// appended to (RFC 7239 section 4). It reports false, and the header is not sent, when the
// peer address does not parse.
func appendForwarded(dst []byte, in *http.Request) ([]byte, bool) {
	peer, ok := parsePeer(in.RemoteAddr)
	if !ok {
		return dst, false
	}
	for _, p := range in.Header["Forwarded"] {
		dst = append(dst, p...)
		dst = append(dst, ", "...)
	}
	dst = append(dst, "for="...)
	if peer.Is6() {
		dst = append(dst, `"[`...)
		dst = peer.AppendTo(dst)
		dst = append(dst, `]"`...)
	} else {
		dst = peer.AppendTo(dst)
	}
	if h := in.Host; h != "" {
		dst = append(dst, ";host="...)
		dst = appendSFString(dst, h) // a quoted-string; the host holds no quote or backslash
	}
	if in.TLS != nil {
		dst = append(dst, ";proto=https"...)
	} else {
		dst = append(dst, ";proto=http"...)
	}
	return dst, true
}

// proxyError answers a request the upstream did not answer.
func (s *Server) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	// A body that could not be read comes first: net/http cancels the request's context when
	// a body read fails, which would look like a client that went away.
	if fw, ok := w.(*forwardWriter); ok {
		if p := fw.body.problem(); p != nil {
			writeProblem(w, p) // forwardWriter.WriteHeader counts it
			return
		}
	}
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the client went away; there is no one to answer
	}
	s.gate.metrics.upstreamErrors.Inc()
	s.gate.log.Warn("ingress: upstream", "method", r.Method, "path", r.URL.Path, "err", err)
	writeProblem(w, problemFor(&upstreamError{err: err}))
}

// ServeHTTP serves one request: decide (which cleans the path first), then forward
// everything but the job API, whatever its method; render errors; count every answer by
// status. Echo routes the job API only: as a pre-routing middleware this would have echo
// build the chain anew for every request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var span trace.Span
	if s.gate.tr.On() {
		r, span = s.gate.traceRequest(r)
	}
	body := wrapBody(w, r, time.Duration(s.writeStall.Load()))
	defer body.release()
	c := s.echo.AcquireContext()
	c.Reset(r, w)
	var h held
	ok, hdrs, err := s.gate.check(c, &h)
	if ok {
		r = c.Request()
		switch {
		case isJobAPI(r.URL.Path):
			if hdrs != nil {
				hdrs.install(c.Response())
			}
			s.echo.Router().Find(r.Method, echo.GetPath(r), c)
			err = c.Handler()(c)
		default:
			if hdrs != nil {
				hdrs.apply(c.Response().Header()) // on the ingress's own errors too
			}
			switch {
			case h.n > 0:
				err = s.forwardHolding(c, hdrs, body, &h)
			case len(h.recon) > 0:
				err = s.forwardReconciling(c, hdrs, body, &h)
			default:
				err = s.forward(c, hdrs, body)
			}
		}
	}
	if err != nil {
		s.handleError(err, c)
	}
	s.gate.metrics.countRequest(c.Response().Status)
	if span != nil {
		endRequest(span, c.Response().Status)
	}
	s.echo.ReleaseContext(c)
}

var errNoUpstream = &Problem{Type: "about:blank", Title: "No upstream", Status: http.StatusBadGateway,
	Detail: "the ingress has no upstream configured"}

// forward proxies the request to the upstream. The response carries hdrs (when not nil)
// over any the upstream sent.
func (s *Server) forward(c echo.Context, hdrs *rateHeaders, body *bodyReader) error {
	return s.forwardKeeping(c, hdrs, body, nil)
}

// forwardReconciling forwards the request of c and then settles the costs of h with what the
// upstream's answer says they were. It settles in a defer: the proxy ends a copy that failed
// (the client gone, the upstream reset, the timeout of forwardHolding) with a panic
// (http.ErrAbortHandler), and a streamed answer cut so is charged all the same (cost_on_cut).
func (s *Server) forwardReconciling(c echo.Context, hdrs *rateHeaders, body *bodyReader, h *held) error {
	ab := &answerBody{keep: h.needsBody(), recon: h.recon}
	if cuts(h.recon) {
		c.SetRequest(c.Request().WithContext(context.WithValue(c.Request().Context(), answerKey{}, ab)))
	}
	finished := false
	defer func() {
		if c.Response().Committed {
			s.gate.settleCosts(h, c.Response().Header(), ab, finished, s.gate.rules.Load().storeTimeout)
		}
		h.recon = nil
	}()
	err := s.forwardKeeping(c, hdrs, body, ab)
	finished = c.Request().Context().Err() == nil
	return err
}

// forwardKeeping is forward, keeping the start of the answer's body in keep when not nil.
func (s *Server) forwardKeeping(c echo.Context, hdrs *rateHeaders, body *bodyReader, keep *answerBody) error {
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
	fw := s.writers.Get().(*forwardWriter)
	fw.res, fw.hdrs, fw.body, fw.m, fw.keep = c.Response(), hdrs, body, s.gate.metrics, keep
	fw.stall = time.Duration(s.writeStall.Load())
	var span trace.Span
	if s.gate.tr.On() {
		r, span = s.gate.traceForward(r, up.url)
	}
	fullDuplex(fw.res.Writer)
	up.proxy.ServeHTTP(fw, r)
	if span != nil {
		endRequest(span, fw.res.Status)
	}
	fw.disarm()
	*fw = forwardWriter{} // ReverseProxy keeps no reference to it once ServeHTTP returns
	s.writers.Put(fw)
	return nil
}

// forwardWriter is the ResponseWriter the ReverseProxy writes to. It sets the rate-limit
// headers over the upstream's just before the status line is written, and passes
// informational (1xx) responses straight through: echo's Response would take a 103 Early
// Hints for the final status and drop the real one.
type forwardWriter struct {
	res *echo.Response
	// stall bounds each write to the client (read_timeout): a client that stops reading its
	// answer is cut off, instead of pinning this connection and the upstream's. 0: none.
	stall time.Duration
	dl    deadliner    // the connection's write deadline, once a write armed it
	hdrs  *rateHeaders // nil: none
	body  *bodyReader  // the request's body, nil for none: a failure to read it is the client's
	m     *metrics     // counts a body problem answered here
	drop  bool         // the upstream's answer is replaced: discard its body
	keep  *answerBody  // nil, or where the answer's start is kept for its true cost
}

func (fw *forwardWriter) Header() http.Header { return fw.res.Header() }

func (fw *forwardWriter) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		if !fw.res.Committed {
			fw.res.Writer.WriteHeader(code)
		}
		return
	}
	if p := fw.body.problem(); p != nil && !fw.res.Committed {
		// The upstream answered a request whose body was cut short (read_timeout) or broken:
		// the client gets the truth about its own request, not that answer.
		fw.m.countBodyProblem(p)
		fw.drop = true
		writeProblem(fw.res, p)
		return
	}
	if fw.hdrs != nil && !fw.res.Committed {
		fw.hdrs.apply(fw.res.Header())
	}
	if fw.keep != nil && !fw.res.Committed {
		fw.keep.header(fw.res.Header())
	}
	fw.res.WriteHeader(code)
}

func (fw *forwardWriter) Write(b []byte) (int, error) {
	if !fw.res.Committed {
		fw.WriteHeader(http.StatusOK)
	}
	if fw.drop {
		return len(b), nil
	}
	if fw.keep != nil {
		fw.keep.write(b)
	}
	if fw.stall > 0 {
		if fw.dl == nil {
			fw.dl = deadlinerOf(fw.res.Writer)
		}
		_ = fw.dl.SetWriteDeadline(time.Now().Add(fw.stall)) // ErrNotSupported: no bound
	}
	return fw.res.Write(b)
}

// fullDuplex lets the forwarded request's body be read after the answer's header is written.
// Without it, net/http's HTTP/1 server drains and closes the body as the header goes out, and
// the transport's last read of it (for the EOF after Content-Length bytes) then fails, which
// makes it close the upstream connection: an answer streamed back before the transport saw
// the end of the body it sent (an upstream that reads the request and streams at once) was
// cut off mid-stream, "use of closed network connection".
func fullDuplex(w http.ResponseWriter) {
	for { // as http.ResponseController finds it, without allocating one
		switch t := w.(type) {
		case interface{ EnableFullDuplex() error }:
			_ = t.EnableFullDuplex()
			return
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return // not needed where it is not supported (HTTP/2)
		}
	}
}

// deadliner is what net/http's own ResponseWriter does for http.ResponseController.
type deadliner interface {
	SetWriteDeadline(time.Time) error
	FlushError() error
}

// deadlinerOf returns w itself when it is net/http's ResponseWriter (no allocation), or else a
// ResponseController that unwraps it.
func deadlinerOf(w http.ResponseWriter) deadliner {
	if d, ok := w.(deadliner); ok {
		return d
	}
	return controller{http.NewResponseController(w)}
}

type controller struct{ *http.ResponseController }

func (c controller) FlushError() error { return c.Flush() }

// disarm flushes what is buffered under the last write's deadline and then clears it: net/http
// keeps a connection's write deadline for its next request, which may be answered by the
// gate itself.
func (fw *forwardWriter) disarm() {
	if fw.dl == nil {
		return
	}
	_ = fw.dl.FlushError()
	_ = fw.dl.SetWriteDeadline(time.Time{})
}

// Unwrap lets http.ResponseController reach Flush and Hijack.
func (fw *forwardWriter) Unwrap() http.ResponseWriter { return fw.res }

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

// Routes returns the routes of the job API as "METHOD /path", with {name} parameters: each
// must be described in the OpenAPI document of the job API (internal/openapi), which a test
// holds them to.
func (s *Server) Routes() []string {
	var out []string
	for _, r := range s.echo.Routes() {
		parts := strings.Split(r.Path, "/")
		for i, p := range parts {
			if name, ok := strings.CutPrefix(p, ":"); ok {
				parts[i] = "{" + name + "}"
			}
		}
		out = append(out, r.Method+" "+strings.Join(parts, "/"))
	}
	return out
}

// openAPIPath is where the listener serves the OpenAPI document of the job API.
const openAPIPath = "/openapi.json"

// isJobAPI reports whether path is served by the job API: /v1/jobs/{id},
// /v1/queues/{queue}/jobs, or its document, /openapi.json (the upstream's own /openapi.json,
// if it has one, is not reachable through the ingress).
func isJobAPI(path string) bool {
	if path == openAPIPath {
		return true
	}
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
	p := bodyProblem(c.Request())
	if p != nil {
		s.gate.metrics.countBodyProblem(p)
	} else {
		p = problemFor(err)
	}
	if p.Status == http.StatusInternalServerError {
		s.gate.log.Error("ingress: request", "method", c.Request().Method, "path", c.Request().URL.Path, "err", err)
	}
	writeProblem(c.Response(), p)
}
