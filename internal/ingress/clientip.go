package ingress

import (
	"net/http"
	"net/netip"
	"strings"

	"github.com/sluice-rl/sluice/retry"
)

// trust is the set of peers whose forwarding headers are believed.
type trust []netip.Prefix

// contains reports whether a is one of the trusted proxies.
func (t trust) contains(a netip.Addr) bool {
	for _, p := range t {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// clientIP returns the address of the client that sent a request, and false when it has none
// (a peer address that does not parse, as over a Unix socket).
//
// It is the peer address, unless the peer is a trusted proxy: then the forwarding header is
// read from right to left, each hop a trusted proxy appended, and the first hop that is not
// itself trusted is the client. If every hop is trusted, the left-most is the client. A hop
// that does not parse ("unknown", an obfuscated identifier, garbage) ends the walk and the
// peer is the client: what lies left of it cannot be told apart from what the client wrote.
//
// X-Forwarded-For is read when present, else Forwarded (RFC 7239). Several lines of one header
// are one list, in order. Addresses are normalised: zones stripped, IPv4-mapped IPv6 unmapped.
func clientIP(remoteAddr string, h http.Header, trusted trust) (netip.Addr, bool) {
	peer, ok := parsePeer(remoteAddr)
	if !ok {
		return netip.Addr{}, false
	}
	if len(trusted) == 0 || !trusted.contains(peer) {
		return peer, true
	}
	if xff := h["X-Forwarded-For"]; len(xff) > 0 {
		return walkXFF(peer, xff, trusted), true
	}
	if fwd := h["Forwarded"]; len(fwd) > 0 {
		return walkForwarded(peer, fwd, trusted), true
	}
	return peer, true
}

// walkXFF walks the X-Forwarded-For lines from the right. It allocates nothing.
func walkXFF(peer netip.Addr, lines []string, trusted trust) netip.Addr {
	last := peer
	for i := len(lines) - 1; i >= 0; i-- {
		s := lines[i]
		for {
			hop := s
			j := strings.LastIndexByte(s, ',')
			if j >= 0 {
				hop = s[j+1:]
			}
			hop = strings.TrimSpace(hop)
			if hop == "" {
				// "a,,b" or a blank line: an empty element is not a hop (RFC 9110 5.6.1 lists
				// allow them); skip it.
			} else {
				a, ok := parseHop(hop)
				if !ok {
					return peer
				}
				if !trusted.contains(a) {
					return a
				}
				last = a
			}
			if j < 0 {
				break
			}
			s = s[:j]
		}
	}
	return last
}

// walkForwarded walks the for= parameters of the Forwarded elements from the right.
func walkForwarded(peer netip.Addr, lines []string, trusted trust) netip.Addr {
	var hops []string
	for _, line := range lines {
		var ok bool
		hops, ok = forwardedFors(hops, line)
		if !ok {
			return peer
		}
	}
	last := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := parseForwardedNode(hops[i])
		if !ok {
			return peer
		}
		if !trusted.contains(a) {
			return a
		}
		last = a
	}
	return last
}

// forwardedFors appends the for= value of each element of one Forwarded field line to dst,
// unquoted. An element without for= yields "" (an unknown hop). It reports false when the
// line is not valid RFC 7239 syntax.
//
//	Forwarded   = 1#forwarded-element
//	forwarded-element = [ forwarded-pair ] *( ";" [ forwarded-pair ] )
//	forwarded-pair = token "=" value
//	value          = token / quoted-string
func forwardedFors(dst []string, line string) ([]string, bool) {
	for i := 0; ; i++ { // i++ steps over the ',' between elements
		forValue, end, ok := forwardedElement(line, i)
		if !ok {
			return dst, false
		}
		dst = append(dst, forValue)
		i = skipOWS(line, end)
		if i >= len(line) {
			return dst, true
		}
		if line[i] != ',' {
			return dst, false
		}
	}
}

// forwardedElement reads the forwarded-element of s that starts at i, and returns its for=
// value ("" when it has none) and where it ends: at the end of s, or at what follows it (a
// ',' when s is valid). It reports false when the element is not valid or names for= twice
// (RFC 7239 4: each parameter at most once per element).
func forwardedElement(s string, i int) (forValue string, end int, ok bool) {
	hasFor := false
	for {
		i = skipOWS(s, i)
		if i < len(s) && s[i] == ';' { // an empty pair
			i++
			continue
		}
		if i >= len(s) || s[i] == ',' {
			return forValue, i, true
		}
		name, value, next, ok := forwardedPair(s, i)
		if !ok {
			return "", i, false
		}
		if strings.EqualFold(name, "for") {
			if hasFor {
				return "", i, false
			}
			forValue, hasFor = value, true
		}
		i = skipOWS(s, next)
		if i >= len(s) || s[i] != ';' {
			return forValue, i, true
		}
		i++
	}
}

// forwardedPair reads the forwarded-pair (token "=" value) of s that starts at i, and returns
// its name, its value (a quoted-string unquoted) and the index after it.
func forwardedPair(s string, i int) (name, value string, end int, ok bool) {
	start := i
	for i < len(s) && isTokenChar(s[i]) {
		i++
	}
	if i == start || i >= len(s) || s[i] != '=' {
		return "", "", i, false
	}
	name = s[start:i]
	i++ // '='
	if i < len(s) && s[i] == '"' {
		v, n, ok := unquote(s[i:])
		return name, v, i + n, ok
	}
	start = i
	for i < len(s) && isTokenChar(s[i]) {
		i++
	}
	return name, s[start:i], i, i > start
}

// unquote decodes the quoted-string at the start of s and returns it, the number of bytes it
// took, and whether it was well formed.
func unquote(s string) (string, int, bool) {
	if len(s) < 2 || s[0] != '"' {
		return "", 0, false
	}
	var b []byte // only when there is an escape
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"':
			if b != nil {
				return string(b), i + 1, true
			}
			return s[1:i], i + 1, true
		case c == '\\':
			if i+1 >= len(s) {
				return "", 0, false
			}
			if b == nil {
				b = append([]byte(nil), s[1:i]...)
			}
			i++
			b = append(b, s[i])
		case c < 0x20 && c != '\t' || c == 0x7f:
			return "", 0, false
		default:
			if b != nil {
				b = append(b, c)
			}
		}
	}
	return "", 0, false
}

func skipOWS(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	return i
}

// isTokenChar reports whether c may appear in an HTTP token (RFC 9110 5.6.2).
func isTokenChar(c byte) bool { return retry.IsTokenChar(c) }

// parseForwardedNode parses an RFC 7239 node: an IPv4 address or a bracketed IPv6 address,
// each with an optional port. "unknown" and obfuscated identifiers do not parse.
func parseForwardedNode(s string) (netip.Addr, bool) {
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		rest := s[end+1:]
		if rest != "" && !validPort(strings.TrimPrefix(rest, ":"), rest[0] == ':') {
			return netip.Addr{}, false
		}
		a, err := netip.ParseAddr(s[1:end])
		if err != nil || !a.Is6() {
			return netip.Addr{}, false
		}
		return norm(a), true
	}
	host, port, hasPort := strings.Cut(s, ":")
	if hasPort && !validPort(port, true) {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(host)
	if err != nil || !a.Is4() {
		return netip.Addr{}, false
	}
	return a, true
}

// validPort reports whether p is an RFC 7239 node-port: 1 to 5 digits, or an obfuscated port
// ("_" followed by letters, digits, ".", "_", "-"). hasColon must be true: a port needs its ':'.
func validPort(p string, hasColon bool) bool {
	if !hasColon || p == "" {
		return false
	}
	if p[0] == '_' {
		for _, c := range []byte(p[1:]) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
				return false
			}
		}
		return true
	}
	if len(p) > 5 {
		return false
	}
	for _, c := range []byte(p) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// parseHop parses one X-Forwarded-For element: an IP address, optionally with a port
// ("192.0.2.1:80", "[2001:db8::1]:80") or brackets ("[2001:db8::1]"), as proxies write them.
func parseHop(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return norm(a), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return norm(ap.Addr()), true
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil && a.Is6() {
			return norm(a), true
		}
	}
	return netip.Addr{}, false
}

// parsePeer parses http.Request.RemoteAddr.
func parsePeer(remoteAddr string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(remoteAddr); err == nil {
		return norm(ap.Addr()), true
	}
	if a, err := netip.ParseAddr(remoteAddr); err == nil {
		return norm(a), true
	}
	return netip.Addr{}, false
}

// norm strips the zone and unmaps IPv4-mapped IPv6 addresses.
func norm(a netip.Addr) netip.Addr { return a.WithZone("").Unmap() }
