// Package httphdr holds what Sluice's HTTP hops agree on about header fields: which of them
// are hop-by-hop, describing one connection rather than the message, and so are never passed
// on by a proxy or replayed by a worker (RFC 9110 section 7.6.1). It is a leaf: it imports the
// standard library only.
package httphdr

import (
	"net/http"
	"net/textproto"
	"strings"
)

// HopByHop lists the hop-by-hop header fields, in the canonical form net/http stores names in:
// Connection and the fields it is made to carry (RFC 9110 7.6.1: Proxy-Connection, Keep-Alive,
// TE, Transfer-Encoding, Upgrade), Trailer, and the proxy's own authentication fields
// (Proxy-Authenticate, Proxy-Authorization, RFC 9110 11.7), the list net/http/httputil's
// ReverseProxy drops. It is an array, so ranging over it copies; do not assign to it.
var HopByHop = [...]string{
	"Connection",
	"Proxy-Connection", // non-standard, still sent by some clients
	"Keep-Alive",
	"Proxy-Authenticate",
	"Proxy-Authorization",
	"Te", // canonical form of TE
	"Trailer",
	"Transfer-Encoding",
	"Upgrade",
}

// RemoveHopByHop deletes from h the fields listed in HopByHop and every field that a
// Connection field of h names (RFC 9110 7.6.1: a proxy removes them before forwarding). Names
// in Connection are compared without regard to case; the keys of h are expected in canonical
// form, as net/http writes them. A nil h is left alone.
func RemoveHopByHop(h http.Header) {
	for _, v := range h["Connection"] {
		for len(v) > 0 {
			var name string
			name, v, _ = strings.Cut(v, ",")
			if name = textproto.TrimString(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range HopByHop {
		delete(h, name)
	}
}

// IsHopByHop reports whether name, in canonical form, is one of HopByHop.
func IsHopByHop(name string) bool {
	switch name {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// ConnectionNames returns the fields that the Connection fields of h name, in canonical form;
// nil when there are none.
func ConnectionNames(h http.Header) []string {
	var names []string
	for _, v := range h["Connection"] {
		for len(v) > 0 {
			var name string
			name, v, _ = strings.Cut(v, ",")
			if name = textproto.TrimString(name); name != "" {
				names = append(names, textproto.CanonicalMIMEHeaderKey(name))
			}
		}
	}
	return names
}

// CutBearer returns the token of an Authorization value of the bearer scheme, whose name is
// matched without regard to case and may be followed by several spaces (RFC 9110 11.1, 11.4),
// and false for any other value.
func CutBearer(v string) (string, bool) {
	const scheme = "bearer"
	if len(v) <= len(scheme) || !strings.EqualFold(v[:len(scheme)], scheme) || v[len(scheme)] != ' ' {
		return "", false
	}
	tok := strings.TrimLeft(v[len(scheme):], " ")
	return tok, tok != ""
}
