package worker

import (
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice/internal/h1"
)

// defaultClient returns the Pool's own client, the spares its connections are dialed from
// (nil where they cannot work), and the direct path for plain http:// upstreams.
func defaultClient() (*http.Client, *spares, *direct) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 256
	t.MaxIdleConnsPerHost = 64
	// Deliver the request as the client sent it: no Accept-Encoding of our own (the default
	// transport adds gzip and decompresses behind the caller's back).
	t.DisableCompression = true
	// Both close a connection idle this long: http.DefaultTransport's 90 s, h1's default.
	if t.IdleConnTimeout <= 0 {
		t.IdleConnTimeout = h1.DefaultIdleTimeout
	}
	// As http.DefaultTransport dials.
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	d := &direct{h1: &h1.Client{Dial: dialer.DialContext, MaxIdle: t.MaxIdleConnsPerHost, MaxIdleTotal: t.MaxIdleConns,
		IdleTimeout: t.IdleConnTimeout}, proxy: t.Proxy}
	var sp *spares
	if sparesWork {
		sp = newSpares(dialer, t.Proxy)
		t.DialContext = sp.dial
		d.h1.Dial = sp.dial
		d.h1.Alive = open
	}
	return &http.Client{
		Transport: t,
		// A redirect is the upstream's answer, not a place to deliver to: 3xx fails the job.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}, sp, d
}

// direct delivers the requests to plain http:// upstreams that no proxy serves in the job's
// own goroutine (package h1), on connections dialed as the client's are (the spares): net/http's
// Transport hands each request to a connection's write loop and its answer back from its read
// loop, four goroutine hand-offs per job, which at a throttled drain's pace cost more CPU than
// the delivery itself (docs/design/worker-costs.md, "Third round"). https, proxied upstreams
// and requests that expect 100-continue or ask for an upgrade go through the client, and so
// does every request while the direct path is off (Pool.SetDirectHTTP, worker.direct_http).
type direct struct {
	h1  *h1.Client
	off atomic.Bool // every request goes through the client
	// proxy is the transport's (nil: none), asked for each request: http.ProxyFromEnvironment
	// reads the environment once per process and answers at once when it set no proxy for the
	// scheme; else it matches the host against NO_PROXY, about what the net/http path pays per
	// request anyway (BENCHMARKS.md, "h1 and spares bounded"). A cache by host would grow with
	// every host ever asked.
	proxy func(*http.Request) (*url.URL, error)
}

// serves reports whether req goes the direct way.
func (d *direct) serves(req *http.Request) bool {
	if d.off.Load() || req.URL.Scheme != "http" || req.Header["Expect"] != nil || req.Header["Upgrade"] != nil {
		return false
	}
	if d.proxy == nil {
		return true
	}
	u, err := d.proxy(req)
	return err == nil && u == nil // a proxy serves it, or choosing one failed: net/http's way
}

// do sends one delivery's request: the direct way when it serves it, else by the client.
func (p *Pool) do(req *http.Request) (*http.Response, error) {
	if p.direct != nil && p.direct.serves(req) {
		return p.direct.h1.Do(req)
	}
	return p.client.Do(req)
}

// SetDirectHTTP turns the direct path for plain http:// upstreams (package h1) on or off, at
// once and for the deliveries that start from then on; a Pool starts with it on. Off, every
// delivery goes through net/http, as https ones do, and the direct path's connections are
// closed: the idle ones at once, one in use when its delivery ends. It is the way around an upstream that misbehaves on the direct path, short of a
// downgrade (config key worker.direct_http). A Pool given its own Deps.HTTP has no direct
// path: then it does nothing. A change is logged. Safe for concurrent use.
func (p *Pool) SetDirectHTTP(on bool) {
	if p.direct == nil || p.direct.off.Swap(!on) == !on {
		return
	}
	if !on {
		p.direct.h1.CloseIdleConnections()
	}
	if p.log != nil {
		p.log.Info("worker: direct path for plain http:// upstreams", "on", on)
	}
}
