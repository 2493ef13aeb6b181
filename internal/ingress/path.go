package ingress

import (
	"net/url"
	"path"
	"strings"
)

// errEncodedDotSegment and errBadPath are the reasons cleanPath refuses a path.
var (
	errEncodedDotSegment = badRequest("encoded dot segment in path", `the path holds "." or ".." written with percent-encoding (%2e) or around an encoded slash (%2f); write the path without them`)
	errBadPath           = badRequest("invalid request path", "the request target must be an absolute path starting with \"/\"")
	errPathDelimiter     = badRequest("invalid request path", `the path holds ";" or "\" (also percent-encoded), which servers split or rewrite in different ways; write the path without them`)
)

// canonicalMethod returns m in upper case, the form rules match and the upstream receives:
// some servers treat "post" as POST, so a rule for POST must too. It does not allocate for a
// method that is already upper case.
func canonicalMethod(m string) string {
	for i := 0; i < len(m); i++ {
		if 'a' <= m[i] && m[i] <= 'z' {
			return strings.ToUpper(m)
		}
	}
	return m
}

// cleanPath makes u's path the one the rules match and the upstream receives: absolute, with
// "." and ".." segments resolved and repeated slashes merged, so that "/api/../admin" is
// "/admin" to both and a ".." can never climb out of a prefix rule. A trailing slash is kept.
//
// A path whose dot segments appear only after percent-decoding ("/api/%2e%2e/admin",
// "/api%2f..%2fadmin") is refused with errEncodedDotSegment: such paths are attacks on proxies
// and servers that decode at different stages, and no client needs them. A path that is
// already clean is left as it is, encoding and all ("/files/a%2Fb" stays as written).
//
// A path with ";" or "\" (decoded) is refused with errPathDelimiter: some servers cut a path
// at ";" (path parameters) or read "\" as "/", so "/api;x" or "/api\x" would escape a rule
// for "/api/*" there.
//
// cleanPath reports whether it changed u.
func cleanPath(u *url.URL) (bool, error) {
	p := u.Path
	if p == "" || p[0] != '/' {
		return false, errBadPath
	}
	if strings.ContainsAny(p, ";\\") {
		return false, errPathDelimiter
	}
	if isClean(p) {
		return false, nil
	}
	if u.RawPath != "" && hasDotSegment(p) {
		return false, errEncodedDotSegment
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	if c == p {
		return false, nil
	}
	u.Path = c
	u.RawPath = "" // re-encoded from Path by url.URL.EscapedPath
	return true, nil
}

// isClean reports whether p has no empty, "." or ".." segment except a trailing empty one
// (a trailing slash). It is the fast path: most request paths are clean.
func isClean(p string) bool {
	for i := 0; i < len(p); i++ {
		if p[i] != '/' {
			continue
		}
		j := i + 1
		switch {
		case j == len(p):
			return true // trailing slash
		case p[j] == '/':
			return false
		case p[j] == '.':
			rest := p[j:]
			if rest == "." || rest == ".." || strings.HasPrefix(rest, "./") || strings.HasPrefix(rest, "../") {
				return false
			}
		}
	}
	return true
}

// hasDotSegment reports whether p has a "." or ".." segment.
func hasDotSegment(p string) bool {
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}
