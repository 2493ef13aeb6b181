package ingress

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

func TestCleanPath(t *testing.T) {
	for raw, want := range map[string]string{
		"/":                 "/",
		"/api/orders":       "/api/orders",
		"/api/orders/":      "/api/orders/",
		"/api/../admin":     "/admin",
		"/api/./x":          "/api/x",
		"//a///b":           "/a/b",
		"/..":               "/",
		"/../../etc/passwd": "/etc/passwd",
		"/a/b/..":           "/a",
		"/a/b/../":          "/a/",
		"/a%2Fb":            "/a%2Fb", // clean: left encoded
		"/a%20b/../c":       "/c",
		"/.well-known/x":    "/.well-known/x",
		"/a/..b":            "/a/..b",
	} {
		u, err := url.ParseRequestURI(raw)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cleanPath(u); err != nil {
			t.Errorf("%s: %v", raw, err)
			continue
		}
		if got := u.EscapedPath(); got != want {
			t.Errorf("%s: cleaned to %s, want %s", raw, got, want)
		}
	}
	for _, raw := range []string{"/%2e%2e/admin", "/api/%2E%2e", "/api/%2e/x", "/api%2F..%2Fadmin", "/a/.%2E/b"} {
		u, err := url.ParseRequestURI(raw)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cleanPath(u); !errors.Is(err, errEncodedDotSegment) {
			t.Errorf("%s: err %v, want the encoded-dot-segment refusal", raw, err)
		}
	}
}

// FuzzCleanPath checks that a cleaned path has no dot segment and no empty segment, that a
// path under a prefix after cleaning was written under it (no ".." climbs out and back in
// unseen), and that cleaning is idempotent.
func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"/api/../admin", "/a/./b//c/", "/%2e%2e", "/a%2fb", "/..;/x", "/x/%252e%252e/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := url.ParseRequestURI(raw)
		if err != nil || u.Opaque != "" || u.Host != "" {
			return
		}
		if _, err := cleanPath(u); err != nil {
			return
		}
		p := u.Path
		if strings.ContainsAny(p, ";\\") {
			t.Fatalf("%q cleaned to %q, which holds ';' or '\\'", raw, p)
		}
		for i, seg := range strings.Split(p, "/")[1:] {
			last := i == strings.Count(p, "/")-1
			if seg == "." || seg == ".." || seg == "" && !last {
				t.Fatalf("%q cleaned to %q", raw, p)
			}
		}
		again := *u
		if changed, err := cleanPath(&again); changed || err != nil {
			t.Fatalf("%q: cleaning %q again changed it (%v, %v)", raw, p, changed, err)
		}
	})
}
