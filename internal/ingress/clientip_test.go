package ingress

import (
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/internal/config"
)

var testTrust = trust{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}

func TestClientIP(t *testing.T) {
	for _, tc := range []struct {
		peer        string
		xff, fwd    []string
		want        string // "" for no address
		description string
	}{
		{"192.0.2.1:5", nil, nil, "192.0.2.1", "untrusted peer"},
		{"192.0.2.1:5", []string{"203.0.113.1"}, nil, "192.0.2.1", "untrusted peer, spoofed XFF"},
		{"10.0.0.1:5", nil, nil, "10.0.0.1", "trusted peer without header"},
		{"10.0.0.1:5", []string{"203.0.113.1"}, nil, "203.0.113.1", "one hop"},
		{"10.0.0.1:5", []string{"1.1.1.1, 203.0.113.1 ,10.2.2.2"}, nil, "203.0.113.1", "right-most untrusted"},
		{"10.0.0.1:5", []string{"1.1.1.1", "203.0.113.1"}, nil, "203.0.113.1", "several lines are one list"},
		{"10.0.0.1:5", []string{"10.3.3.3, 10.2.2.2"}, nil, "10.3.3.3", "all trusted: left-most"},
		{"10.0.0.1:5", []string{"203.0.113.1,,"}, nil, "203.0.113.1", "empty elements skipped"},
		{"10.0.0.1:5", []string{"1.1.1.1, bogus"}, nil, "10.0.0.1", "bad hop: the peer"},
		{"10.0.0.1:5", []string{"203.0.113.1:8080"}, nil, "203.0.113.1", "hop with port"},
		{"10.0.0.1:5", []string{"[2001:db9::1]:80"}, nil, "2001:db9::1", "bracketed IPv6 with port"},
		{"10.0.0.1:5", []string{"[2001:db9::1]"}, nil, "2001:db9::1", "bracketed IPv6"},
		{"10.0.0.1:5", []string{"fe80::1%eth0"}, nil, "fe80::1", "zone stripped"},
		{"10.0.0.1:5", []string{"::ffff:203.0.113.9"}, nil, "203.0.113.9", "IPv4-mapped unmapped"},
		{"[::ffff:10.0.0.1]:5", []string{"203.0.113.1"}, nil, "203.0.113.1", "IPv4-mapped peer is trusted"},
		{"[2001:db8::5]:5", nil, []string{`for=192.0.2.60;proto=http;by=203.0.113.43`}, "192.0.2.60", "Forwarded"},
		{"[2001:db8::5]:5", nil, []string{`for="[2001:db9:cafe::17]:4711"`}, "2001:db9:cafe::17", "Forwarded IPv6 with port"},
		{"10.0.0.1:5", nil, []string{`for=192.0.2.43, for=10.1.1.1`}, "192.0.2.43", "Forwarded walk"},
		{"10.0.0.1:5", nil, []string{`for=192.0.2.43`, `For="10.1.1.1"`}, "192.0.2.43", "Forwarded lines, case-insensitive name"},
		{"10.0.0.1:5", nil, []string{`for=unknown`}, "10.0.0.1", "Forwarded unknown"},
		{"10.0.0.1:5", nil, []string{`for=_hidden, for=10.1.1.1`}, "10.0.0.1", "Forwarded obfuscated"},
		{"10.0.0.1:5", nil, []string{`for="192.0.2.1`}, "10.0.0.1", "unterminated quote"},
		{"10.0.0.1:5", nil, []string{`for=192.0.2.1;for=192.0.2.2`}, "10.0.0.1", "for twice in an element"},
		{"10.0.0.1:5", nil, []string{`proto=https`}, "10.0.0.1", "element without for"},
		{"10.0.0.1:5", nil, []string{`for="\"quoted\"", for=192.0.2.1`}, "192.0.2.1", "escapes left of the client"},
		{"10.0.0.1:5", []string{"198.51.100.1"}, []string{"for=203.0.113.1"}, "198.51.100.1", "X-Forwarded-For preferred"},
		{"@", nil, nil, "", "unix socket peer"},
		{"192.0.2.1", nil, nil, "192.0.2.1", "peer without port"},
	} {
		h := http.Header{}
		if tc.xff != nil {
			h["X-Forwarded-For"] = tc.xff
		}
		if tc.fwd != nil {
			h["Forwarded"] = tc.fwd
		}
		got, ok := clientIP(tc.peer, h, testTrust)
		if tc.want == "" {
			if ok {
				t.Errorf("%s: got %v, want none", tc.description, got)
			}
			continue
		}
		if !ok || got != netip.MustParseAddr(tc.want) {
			t.Errorf("%s: got %v (%v), want %s", tc.description, got, ok, tc.want)
		}
	}
}

// checkClientIP asserts what must hold for any input: no panic, and the address is the
// peer's or one written in the headers, normalised, and never taken from an untrusted peer's
// headers.
func checkClientIP(t *testing.T, peer string, h http.Header) {
	got, ok := clientIP(peer, h, testTrust)
	p, pok := parsePeer(peer)
	if ok != pok {
		t.Fatalf("clientIP ok=%v, peer parses %v", ok, pok)
	}
	if !ok {
		return
	}
	if got.Zone() != "" || got.Is4In6() {
		t.Fatalf("address %v not normalised", got)
	}
	if !testTrust.contains(p) && got != p {
		t.Fatalf("untrusted peer %v, but the client is %v", p, got)
	}
}

// FuzzClientIP feeds arbitrary X-Forwarded-For values from trusted and untrusted peers.
func FuzzClientIP(f *testing.F) {
	for _, s := range []string{"203.0.113.1", "1.1.1.1, 10.0.0.2", "[::1]:80, fe80::1%eth0", "::ffff:1.2.3.4", ",,", "", " , 300.1.1.1", "a, b, c"} {
		f.Add("10.0.0.1:1", s)
		f.Add("192.0.2.1:1", s)
	}
	f.Fuzz(func(t *testing.T, peer, xff string) {
		checkClientIP(t, peer, http.Header{"X-Forwarded-For": strings.Split(xff, "\n")})
	})
}

// FuzzForwarded feeds arbitrary Forwarded values.
func FuzzForwarded(f *testing.F) {
	for _, s := range []string{
		`for=192.0.2.60;proto=http;by=203.0.113.43`,
		`for="[2001:db8:cafe::17]:4711"`,
		`for=192.0.2.43, for=198.51.100.17`,
		`for="\"x\""; by=_a`, `for=unknown`, `;;,`, `for="[::1`, `for=1.2.3.4:99999`, `for="_x:_y"`,
	} {
		f.Add("10.0.0.1:1", s)
		f.Add("[2001:db8::1]:1", s)
	}
	f.Fuzz(func(t *testing.T, peer, fwd string) {
		checkClientIP(t, peer, http.Header{"Forwarded": strings.Split(fwd, "\n")})
		// The element parser never reads past the line, and yields a value per element.
		fors, ok := forwardedFors(nil, fwd)
		if ok && len(fors) == 0 {
			t.Fatalf("%q parsed to no elements", fwd)
		}
	})
}

// FuzzKey builds keys from arbitrary header and query values: never too long, never empty,
// and two requests that differ in their key part never share a key.
func FuzzKey(f *testing.F) {
	f.Add("alice", "bob", "t=1")
	f.Add("", "\x01", "tenant=%00")
	f.Add(strings.Repeat("k", 300), strings.Repeat("k", 299), "tenant="+strings.Repeat("x", 600))
	f.Add("a\x00b", "a", "")
	r, err := compileRule(&config.Config{}, config.Rule{
		Name: "r", Algorithm: "fixed_window", Limit: 1, Period: 1e9,
		Key: []config.KeyPart{{Kind: config.KeyHeader, Name: "X-Key"}, {Kind: config.KeyQuery, Name: "tenant"}, {Kind: config.KeyIP}},
	}, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, a, b, rawQuery string) {
		key := func(v string) string {
			req := &http.Request{Header: http.Header{"X-Key": {v}}, URL: &url.URL{Path: "/", RawQuery: rawQuery}, RemoteAddr: "192.0.2.1:1"}
			return string(r.appendKey(nil, &request{r: req}))
		}
		ka, kb := key(a), key(b)
		for _, k := range []string{ka, kb} {
			if len(k) == 0 || len(k) > 400 {
				t.Fatalf("key of %d bytes", len(k))
			}
		}
		if a != b && ka == kb {
			t.Fatalf("values %q and %q share the key %q", a, b, ka)
		}
	})
}
