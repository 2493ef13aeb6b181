package app

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	sluiceconfig "github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/connect"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// jobStream is the stream that holds the jobs of plain queue name under a config that does not
// set nats.shared_streams: one of the default count of shared streams.
func jobStream(name string) string {
	h := fnv.New32a()
	h.Write([]byte(name))
	return fmt.Sprintf("SLUICE_J_%d", h.Sum32()%uint32(sluiceconfig.DefaultSharedStreams))
}

// natsUsers is a nats-server config with users of narrower and narrower permissions; admin
// (with every permission) serves the connections without a user, as testenv's own probe.
const natsUsers = `authorization {
  users = [
    { user: admin, password: admin }
    { user: jobsonly, password: p, permissions: { publish: ["SLUICE.>"], subscribe: ["_INBOX.>"] } }
    { user: nocreate, password: p, permissions: {
        publish: { allow: ["$JS.API.>", "$JS.ACK.>", "$KV.>", "SLUICE.>"], deny: ["$JS.API.STREAM.CREATE.>"] },
        subscribe: ["_INBOX.>"] } }
    { user: nojobs, password: p, permissions: { publish: ["$JS.API.>", "$JS.ACK.>", "$KV.>"], subscribe: ["_INBOX.>"] } }
    { user: noinbox, password: p, permissions: { publish: ["$JS.API.>", "$JS.ACK.>", "$KV.>", "SLUICE.>"], subscribe: ["other.>"] } }
    { user: enough, password: p, ` + queue.PermissionsFix + ` }
  ]
}
no_auth_user: admin
`

// TestNATSWithoutPermissionsFailsFast: a NATS user who may not use a subject Sluice needs
// (JetStream's API, a stream's creation, the queues' subjects, a reply inbox) makes the ingress
// and the worker stop at start with a config error that names what was refused and the fix,
// instead of retrying for ever. A user granted queue.PermissionsFix starts, and the probe
// leaves no message in the stream or the status bucket.
func TestNATSWithoutPermissionsFailsFast(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(conf, []byte(natsUsers), 0o644); err != nil {
		t.Fatal(err)
	}
	ns := testenv.NATSProcIn(t, filepath.Join(dir, "js"), "-c", conf)
	rs := testenv.Redis(t)
	config := func(user string) string {
		return fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
redis: { url: %q }
nats: { url: %q }
queues:
  - { name: q, rate: 5/s, target: "POST http://127.0.0.1:1/x" }
`, rs.URL(), strings.Replace(ns.URL, "nats://", "nats://"+user+":p@", 1))
	}
	for _, c := range []struct{ user, refused string }{
		{"jobsonly", `Publish to "$JS.API.INFO"`},
		{"nocreate", `Publish to "$JS.API.STREAM.CREATE.KV_SLUICE_STATUS"`},
		{"nojobs", `Publish to "SLUICE.q.q.permission-probe"`},
		{"noinbox", `Subscription to "_INBOX.`},
	} {
		path := filepath.Join(dir, c.user+".yaml")
		if err := os.WriteFile(path, []byte(config(c.user)), 0o644); err != nil {
			t.Fatal(err)
		}
		for proc, run := range map[string]func(context.Context) error{
			"ingress": Ingress{ConfigPath: path, Logger: testLogger()}.Run,
			"worker":  Worker{ConfigPath: path, Logger: testLogger()}.Run,
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			start := time.Now()
			err := run(ctx)
			late := ctx.Err() != nil
			cancel()
			if late {
				t.Fatalf("%s as %s still running after 10s, want it to stop at once", proc, c.user)
			}
			if err == nil || !errors.Is(err, connect.ErrConfig) || !strings.Contains(err.Error(), "refused "+c.refused) ||
				!strings.Contains(err.Error(), queue.PermissionsFix) {
				t.Errorf("%s as %s: %v; want a config error naming %s and the fix", proc, c.user, err, c.refused)
				continue
			}
			t.Logf("%s as %s stopped after %v", proc, c.user, time.Since(start).Round(time.Millisecond))
		}
	}

	start(t, t.TempDir(), config("enough"))
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	names := []string{jobStream("q"), "KV_SLUICE_STATUS"}
	for _, name := range names {
		testenv.WaitFor(t, 10*time.Second, "the ingress as enough to provision "+name, func() bool {
			_, err := js.Stream(ctx, name)
			return err == nil
		})
	}
	// Probe again now that the streams exist: their subjects' probes are refused by them.
	enough, err := nats.Connect(strings.Replace(ns.URL, "nats://", "nats://enough:p@", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer enough.Close()
	enoughJS, err := jetstream.New(enough)
	if err != nil {
		t.Fatal(err)
	}
	if err := queue.CheckPermissions(ctx, enoughJS, []string{"q"}); err != nil {
		t.Fatalf("probe as enough: %v", err)
	}
	for _, name := range names {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if n := st.CachedInfo().State.Msgs; n != 0 {
			t.Errorf("stream %s holds %d messages after the permission probe, want 0", name, n)
		}
	}
}

// TestNATSWrongPasswordFailsFast: credentials the server refuses make the ingress and the
// worker stop at start with a config error that names nats.url and the server's answer,
// instead of retrying for ever on a connection nats.go has closed for good.
func TestNATSWrongPasswordFailsFast(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(conf, []byte(natsUsers), 0o644); err != nil {
		t.Fatal(err)
	}
	ns := testenv.NATSProcIn(t, filepath.Join(dir, "js"), "-c", conf)
	rs := testenv.Redis(t)
	path := filepath.Join(dir, "sluice.yaml")
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
redis: { url: %q }
nats: { url: %q }
queues:
  - { name: q, rate: 5/s, target: "POST http://127.0.0.1:1/x" }
`, rs.URL(), strings.Replace(ns.URL, "nats://", "nats://enough:s3cret-x@", 1))
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	for proc, run := range map[string]func(context.Context) error{
		"ingress": Ingress{ConfigPath: path, Logger: testLogger()}.Run,
		"worker":  Worker{ConfigPath: path, Logger: testLogger()}.Run,
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		start := time.Now()
		err := run(ctx)
		late := ctx.Err() != nil
		cancel()
		if late {
			t.Fatalf("%s with a wrong password still running after 15s (%v), want it to stop", proc, err)
		}
		if err == nil || !errors.Is(err, connect.ErrConfig) || !strings.Contains(err.Error(), "nats.url") ||
			!strings.Contains(strings.ToLower(err.Error()), "authorization") || strings.Contains(err.Error(), "s3cret-x") {
			t.Errorf("%s with a wrong password: %v; want a config error naming nats.url and the refusal, without the password", proc, err)
			continue
		}
		t.Logf("%s with a wrong password stopped after %v: %v", proc, time.Since(start).Round(time.Millisecond), err)
	}
}

// TestNATSPasswordNotLogged: a worker whose nats.url carries a user and password starts and
// drains without writing the password to its logs (the URL is redacted where it is logged).
func TestNATSPasswordNotLogged(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	users := strings.Replace(natsUsers, "{ user: enough, password: p,", "{ user: enough, password: s3cret-x,", 1)
	if err := os.WriteFile(conf, []byte(users), 0o644); err != nil {
		t.Fatal(err)
	}
	ns := testenv.NATSProcIn(t, filepath.Join(dir, "js"), "-c", conf)
	rs := testenv.Redis(t)
	path := filepath.Join(dir, "sluice.yaml")
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
redis: { url: %q }
nats: { url: %q }
queues:
  - { name: q, rate: 5/s, target: "POST http://127.0.0.1:1/x" }
`, rs.URL(), strings.Replace(ns.URL, "nats://", "nats://enough:s3cret-x@", 1))
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Worker{ConfigPath: path, Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
			Ready: func(string) { close(ready) }}.Run(ctx)
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("worker stopped before it drained: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("worker not draining after 20s")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "worker: draining") {
		t.Fatalf("no draining line in the logs:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "s3cret-x") {
		t.Fatalf("the worker's logs carry the NATS password:\n%s", logs.String())
	}
}
