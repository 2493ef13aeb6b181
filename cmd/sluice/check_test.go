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
	"github.com/sluice-rl/sluice/queue"
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

// TestCheckNATSPermissions: `sluice check` against a nats-server whose user may publish only
// to the queues' subjects fails (exit 1) naming what the server refused and the grant that
// fixes it; the same config with a user granted queue.PermissionsFix passes.
func TestCheckNATSPermissions(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(conf, []byte(`authorization {
  users = [
    { user: admin, password: admin }
    { user: jobsonly, password: p, permissions: { publish: ["SLUICE.>"], subscribe: ["_INBOX.>"] } }
    { user: enough, password: p, `+queue.PermissionsFix+` }
  ]
}
no_auth_user: admin
`), 0o644); err != nil {
		t.Fatal(err)
	}
	ns := testenv.NATSProcIn(t, filepath.Join(dir, "js"), "-c", conf)
	for _, tc := range []struct {
		user     string
		code     int
		out, err string
	}{
		{"jobsonly", 1, "", `refused Publish to "$JS.API.INFO"; Sluice needs publish on $JS.API.>`},
		{"enough", 0, "nats: ok: JetStream, the user's permissions", ""},
	} {
		file := filepath.Join(dir, tc.user+".yaml")
		url := strings.Replace(ns.URL, "nats://", "nats://"+tc.user+":p@", 1)
		body := fmt.Sprintf("nats: {url: %q}\nqueues: [{name: q, rate: 5/s, target: \"http://127.0.0.1:1/x\"}]\n", url)
		if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		code := run(context.Background(), []string{"check", "-config", file}, func(string) string { return "" }, &out, &errOut)
		if code != tc.code || !strings.Contains(out.String(), tc.out) || !strings.Contains(errOut.String(), tc.err) {
			t.Errorf("sluice check as %s: exit %d (want %d)\nstdout: %s\nstderr: %s", tc.user, code, tc.code, out.String(), errOut.String())
		}
		if tc.code == 1 {
			t.Logf("sluice check as %s: %s", tc.user, strings.TrimSpace(errOut.String()))
		}
	}
	// A password the server refuses: named as the server's answer, the password not written.
	file := filepath.Join(dir, "wrongpw.yaml")
	url := strings.Replace(ns.URL, "nats://", "nats://enough:s3cret-x@", 1)
	body := fmt.Sprintf("nats: {url: %q}\nqueues: [{name: q, rate: 5/s, target: \"http://127.0.0.1:1/x\"}]\n", url)
	if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"check", "-config", file}, func(string) string { return "" }, &out, &errOut)
	if code != 1 || !strings.Contains(strings.ToLower(errOut.String()), "authorization violation") || strings.Contains(errOut.String(), "s3cret-x") {
		t.Errorf("sluice check with a refused password: exit %d (want 1)\nstdout: %s\nstderr: %s", code, out.String(), errOut.String())
	}
}

// TestCheckRedisRefusedCredentials: `sluice check` against a Redis that refuses the config's
// password says so, naming redis.url, rather than that Redis did not answer.
func TestCheckRedisRefusedCredentials(t *testing.T) {
	rs := testenv.RedisWith(t, "--requirepass", "right-pw")
	path := filepath.Join(t.TempDir(), "c.yaml")
	body := fmt.Sprintf("redis: {url: %q}\nqueues: [{name: q, rate: 5/s, target: \"http://127.0.0.1:1/x\"}]\n",
		strings.Replace(rs.URL(), "redis://", "redis://:s3cret-x@", 1))
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"check", "-config", path}, func(string) string { return "" }, &out, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), "redis.url: the server refused the credentials: WRONGPASS") ||
		strings.Contains(errOut.String(), "s3cret-x") {
		t.Fatalf("exit %d (want 1)\nstdout: %s\nstderr: %s", code, out.String(), errOut.String())
	}
}
