package httphdr

import (
	"net/http"
	"slices"
	"testing"
)

func TestRemoveHopByHop(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   http.Header
		want []string // the names left, sorted
	}{
		{
			name: "every listed field",
			in: http.Header{
				"Connection": {"close"}, "Proxy-Connection": {"keep-alive"}, "Keep-Alive": {"timeout=5"},
				"Proxy-Authenticate": {"Basic"}, "Proxy-Authorization": {"Basic eDp5"}, "Te": {"trailers"},
				"Trailer": {"Expires"}, "Transfer-Encoding": {"chunked"}, "Upgrade": {"websocket"},
				"Content-Type": {"text/plain"},
			},
			want: []string{"Content-Type"},
		},
		{
			name: "end-to-end fields stay",
			in:   http.Header{"Authorization": {"Bearer x"}, "Accept": {"*/*"}, "X-Api-Key": {"k"}, "Content-Length": {"3"}, "Host": {"h"}},
			want: []string{"Accept", "Authorization", "Content-Length", "Host", "X-Api-Key"},
		},
		{
			name: "fields Connection names, in any case, with spaces and empty elements, over several lines",
			in: http.Header{
				"Connection": {" x-hop-a ,, X-HOP-B", "\tx-hop-c\t", ","},
				"X-Hop-A":    {"1"}, "X-Hop-B": {"2"}, "X-Hop-C": {"3"}, "X-End": {"4"},
			},
			want: []string{"X-End"},
		},
		{
			name: "Connection may name an end-to-end field: it was meant for this hop",
			in:   http.Header{"Connection": {"Authorization"}, "Authorization": {"Bearer x"}, "Accept": {"*/*"}},
			want: []string{"Accept"},
		},
		{
			name: "a name not present is nothing to remove",
			in:   http.Header{"Connection": {"keep-alive, upgrade, x-absent"}, "Accept": {"*/*"}},
			want: []string{"Accept"},
		},
		{
			name: "without Connection, only the listed fields go",
			in:   http.Header{"Keep-Alive": {"timeout=5"}, "X-Hop-A": {"1"}},
			want: []string{"X-Hop-A"},
		},
		{name: "empty", in: http.Header{}, want: nil},
		{name: "nil", in: nil, want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			RemoveHopByHop(tc.in)
			var got []string
			for name := range tc.in {
				got = append(got, name)
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("left %q, want %q", got, tc.want)
			}
		})
	}
}

// TestHopByHopCanonical: the names are in the form net/http stores them in, or deleting them
// from a header map would miss.
func TestHopByHopCanonical(t *testing.T) {
	for _, name := range HopByHop {
		if c := http.CanonicalHeaderKey(name); c != name {
			t.Errorf("%q is not canonical: %q", name, c)
		}
	}
}

// IsHopByHop agrees with the list, and ConnectionNames reads what RemoveHopByHop removes.
func TestIsHopByHopAndConnectionNames(t *testing.T) {
	for _, name := range HopByHop {
		if !IsHopByHop(name) {
			t.Errorf("IsHopByHop(%q) = false, want true: it is in HopByHop", name)
		}
	}
	for _, name := range []string{"Host", "Content-Type", "Te-Extra", "connection", "X-Hop", ""} {
		if IsHopByHop(name) {
			t.Errorf("IsHopByHop(%q) = true, want false", name)
		}
	}
	h := http.Header{"Connection": {"keep-alive, x-hop ,", " X-Other"}}
	if got, want := ConnectionNames(h), []string{"Keep-Alive", "X-Hop", "X-Other"}; !slices.Equal(got, want) {
		t.Errorf("ConnectionNames = %q, want %q", got, want)
	}
	if got := ConnectionNames(http.Header{"Accept": {"*/*"}}); got != nil {
		t.Errorf("ConnectionNames without Connection = %q, want nil", got)
	}
}
