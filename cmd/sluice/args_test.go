package main

import (
	"slices"
	"testing"
)

func TestGlobalOptionsAnywhere(t *testing.T) {
	for _, tc := range []struct {
		args          []string
		globals, rest []string
	}{
		{[]string{"queues", "--json"}, []string{"--json"}, []string{"queues"}},
		{[]string{"--json", "queue", "orders"}, []string{"--json"}, []string{"queue", "orders"}},
		{[]string{"queue", "orders", "--admin", "http://x:1", "-json"}, []string{"--admin", "http://x:1", "-json"}, []string{"queue", "orders"}},
		{[]string{"jobs", "orders", "--json", "--state", "all"}, []string{"--json"}, []string{"jobs", "orders", "--state", "all"}},
		{[]string{"pause", "orders", "--for", "30s", "--timeout=2s"}, []string{"--timeout=2s"}, []string{"pause", "orders", "--for", "30s"}},
		{[]string{"--bogus", "queues"}, []string{"--bogus"}, []string{"queues"}}, // a usage error, from the global parse
		{[]string{"job", "get", "--", "--json"}, nil, []string{"job", "get", "--json"}},
	} {
		g, r := hoistGlobals(tc.args)
		if !slices.Equal(g, tc.globals) || !slices.Equal(r, tc.rest) {
			t.Errorf("hoistGlobals(%q) = %q, %q; want %q, %q", tc.args, g, r, tc.globals, tc.rest)
		}
	}
}

func TestPerSecondForPeople(t *testing.T) {
	for in, want := range map[float64]string{
		8.333333333333334: "8.33/s", 2: "2/s", 0.5: "0.5/s", 41.666: "41.7/s", 2000: "2000/s", 0: "0/s", 166.66: "167/s",
	} {
		if got := perSecond(in); got != want {
			t.Errorf("perSecond(%v) = %q, want %q", in, got, want)
		}
	}
}
