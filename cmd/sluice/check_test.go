package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// TestCheck runs `sluice check` on files that do not load, that load with a warning, and that
// name real servers: a Redis and a single NATS server, which can run one replica and not three.
func TestCheck(t *testing.T) {
	rs := testenv.Redis(t)
	ns := testenv.NATS(t)
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	servers := fmt.Sprintf("redis: {url: %q}\nnats: {url: %q, replicas: REPLICAS}\nqueues: [{name: q, rate: 5/s, target: \"http://127.0.0.1:1/x\"}]\n", rs.URL(), ns.URL)
	for _, tc := range []struct {
		name, file string
		args       []string
		code       int
		out, err   string
	}{
		{"unknown field", write("bad.yaml", "queues: [{name: q, rat: 5/s}]\n"), nil, 2, "", `bad.yaml:1: queues[0] "q": unknown field "rat"`},
		{"missing file", filepath.Join(dir, "none.yaml"), nil, 2, "", "none.yaml"},
		{"warning, offline", write("warn.yaml", `upstream: http://127.0.0.1:1
queues: [{name: orders, rate: 2/s}]
rules: [{name: r, key: "header:X-API-Key", action: enqueue, queue: orders}]
`), []string{"-offline"}, 0, "warning: ", ""},
		{"servers that can run it", write("ok.yaml", strings.Replace(servers, "REPLICAS", "1", 1)), nil, 0, "nats: ok: JetStream", ""},
		{"three replicas on one server", write("r3.yaml", strings.Replace(servers, "REPLICAS", "3", 1)), nil, 1, "redis: ok", "set nats.replicas: 1, or run a JetStream cluster of at least 3 servers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			args := append([]string{"check", "-config", tc.file}, tc.args...)
			code := run(context.Background(), args, func(string) string { return "" }, &out, &errOut)
			if code != tc.code || !strings.Contains(out.String(), tc.out) || !strings.Contains(errOut.String(), tc.err) {
				t.Fatalf("sluice %q: exit %d (want %d)\nstdout: %s\nstderr: %s", args, code, tc.code, out.String(), errOut.String())
			}
		})
	}
}
