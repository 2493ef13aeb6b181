package admin

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// The admin listener answers its operators' browsers and tools, never another site's page:
//
//   - the Host rule: a request must name the listener itself as its Host: a loopback name
//     (localhost, 127.0.0.0/8, [::1]), the address it was reached on, admin_listen's host, or
//     one of admin_hosts. A DNS-rebinding page reaches the listener under its own name, so it
//     can neither read queues, jobs and dead letters nor write. /healthz, /readyz and
//     /metrics are exempt: they reveal no tenant's data, and probes and scrapers name the
//     process by whatever name their platform gives it.
//   - the origin rule: a write (any method but GET, HEAD and OPTIONS) is refused when a
//     browser says it comes from elsewhere: Sec-Fetch-Site cross-site or same-site, or an
//     Origin that is not the listener's own. Tools that send neither (curl, the CLI) pass.
//
// Both hold with or without an admin token: a token typed into the dashboard does not make a
// form on another site harmless, and with no token a loopback peer is every browser on the
// operator's machine.

// maxAdminBody bounds a request body on the admin listener, in bytes.
const maxAdminBody = 1 << 20

// probePaths are served whatever the Host.
var probePaths = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true}

// AllowHosts sets where the server reads the names it answers besides its own address and
// loopback ones (config admin_hosts: "host" for any port, or "host:port", lowercased); it is
// called per request, so a reloaded config applies at once. Nil: none.
func (s *Server) AllowHosts(hosts func() []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hosts = hosts
}

// OnRefuse sets a function told of every request the Host or origin rule refuses (to log and
// count it), with the reason the client is given.
func (s *Server) OnRefuse(f func(r *http.Request, why string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onRefuse = f
}

// guard applies the Host and origin rules and bounds the body, then serves next.
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		why := ""
		if !probePaths[r.URL.Path] && !s.hostAllowed(r) {
			why = "Host " + quote(r.Host) + " is not this admin listener's: use its address, a loopback name, or list the name in admin_hosts"
		} else if !safeMethod(r.Method) {
			why = crossOrigin(r)
		}
		if why != "" {
			s.mu.Lock()
			f := s.onRefuse
			s.mu.Unlock()
			if f != nil {
				f(r, why)
			}
			writeProblem(w, http.StatusForbidden, "Forbidden", why)
			return
		}
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, maxAdminBody)
		}
		next.ServeHTTP(w, r)
	})
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// crossOrigin returns why the write r comes from another origin, or "" when it does not
// (or says nothing about its origin, as non-browser clients do).
func crossOrigin(r *http.Request) string {
	switch site := r.Header.Get("Sec-Fetch-Site"); site {
	case "cross-site", "same-site":
		return "writes from another site's page are refused (Sec-Fetch-Site: " + site + ")"
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return ""
	}
	u, err := url.Parse(o)
	if err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Path == "" &&
		authority(u.Scheme, u.Host) == authority(u.Scheme, r.Host) {
		return ""
	}
	return "writes from another origin are refused (Origin " + quote(o) + ", Host " + quote(r.Host) + ")"
}

// authority is host:port lowercased, with scheme's default port when hostport has none.
func authority(scheme, hostport string) string {
	hostport = strings.ToLower(hostport)
	if _, _, err := net.SplitHostPort(hostport); err == nil {
		return hostport
	}
	if scheme == "https" {
		return net.JoinHostPort(strings.Trim(hostport, "[]"), "443")
	}
	return net.JoinHostPort(strings.Trim(hostport, "[]"), "80")
}

// hostAllowed reports whether r's Host names this listener.
func (s *Server) hostAllowed(r *http.Request) bool {
	if r.Host == "" { // HTTP/1.0 without Host: no browser sends it
		return true
	}
	hostport := strings.ToLower(r.Host)
	name := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		name = h
	}
	name = strings.TrimSuffix(strings.Trim(name, "[]"), ".")
	if name == "localhost" {
		return true
	}
	if a, err := netip.ParseAddr(name); err == nil {
		a = a.Unmap()
		if a.IsLoopback() || a == localAddr(r.Context()) {
			return true
		}
	}
	if own, _, err := net.SplitHostPort(s.addr); err == nil && own != "" && strings.EqualFold(strings.Trim(own, "[]"), name) {
		if a, err := netip.ParseAddr(own); err != nil || !a.IsUnspecified() {
			return true
		}
	}
	s.mu.Lock()
	hosts := s.hosts
	s.mu.Unlock()
	if hosts == nil {
		return false
	}
	bracketed := name
	if strings.Contains(name, ":") {
		bracketed = "[" + name + "]"
	}
	for _, h := range hosts() {
		if h == bracketed || h == hostport {
			return true
		}
	}
	return false
}

// localAddr is the address of the listener that accepted the request, or the zero Addr.
func localAddr(ctx context.Context) netip.Addr {
	if a, ok := ctx.Value(http.LocalAddrContextKey).(net.Addr); ok {
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			return ap.Addr().Unmap()
		}
	}
	return netip.Addr{}
}

// quote quotes what a client sent for a message, cut to 100 bytes.
func quote(s string) string {
	if len(s) > 100 {
		s = s[:100] + "…"
	}
	return strconv.Quote(s)
}
