package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/connect"
	"github.com/sluice-rl/sluice/internal/testenv"
)

// TestRedisWithoutLuaFailsFast: on a Redis whose EVAL and EVALSHA are renamed away (as some
// managed services do), the ingress and the worker stop at start with a config error that says
// what Sluice needs, instead of failing every decision at run time.
func TestRedisWithoutLuaFailsFast(t *testing.T) {
	rs := testenv.RedisWith(t, "--rename-command", "EVAL", "", "--rename-command", "EVALSHA", "")
	ns := testenv.NATS(t)
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
redis: { url: %q }
nats: { url: %q }
queues:
  - { name: q, rate: 5/s, target: "POST http://127.0.0.1:1/x" }
`, rs.URL(), ns.URL)
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for proc, run := range map[string]func(context.Context) error{
		"ingress": Ingress{ConfigPath: path, Logger: testLogger()}.Run,
		"worker":  Worker{ConfigPath: path, Logger: testLogger()}.Run,
	} {
		err := run(ctx)
		if ctx.Err() != nil {
			t.Fatalf("%s still running after 10s, want it to stop at once", proc)
		}
		if err == nil || !errors.Is(err, connect.ErrConfig) || !strings.Contains(err.Error(), "does not run Lua scripts") {
			t.Errorf("%s: %v, want a config error saying the Redis does not run Lua", proc, err)
		}
	}
}

// TestRedisWrongPasswordFailsFast: credentials the Redis server refuses (a wrong password, or
// none where one is required) make the ingress and the worker stop at start with a config error
// that names redis.url, without the password, instead of starting and failing every call.
func TestRedisWrongPasswordFailsFast(t *testing.T) {
	rs := testenv.RedisWith(t, "--requirepass", "right-pw")
	ns := testenv.NATS(t)
	for _, url := range []string{
		strings.Replace(rs.URL(), "redis://", "redis://:s3cret-x@", 1), // WRONGPASS
		rs.URL(), // NOAUTH
	} {
		cfg := fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
redis: { url: %q }
nats: { url: %q }
queues:
  - { name: q, rate: 5/s, target: "POST http://127.0.0.1:1/x" }
`, url, ns.URL)
		path := filepath.Join(t.TempDir(), "sluice.yaml")
		if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		for proc, run := range map[string]func(context.Context) error{
			"ingress": Ingress{ConfigPath: path, Logger: testLogger()}.Run,
			"worker":  Worker{ConfigPath: path, Logger: testLogger()}.Run,
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := run(ctx)
			late := ctx.Err() != nil
			cancel()
			if late {
				t.Fatalf("%s with %s still running after 10s, want it to stop at once", proc, url)
			}
			if err == nil || !errors.Is(err, connect.ErrConfig) || !strings.Contains(err.Error(), "redis.url") ||
				!strings.Contains(err.Error(), "refused the credentials") || strings.Contains(err.Error(), "s3cret-x") {
				t.Errorf("%s with %s: %v, want a config error naming redis.url and the refusal, without the password", proc, url, err)
				continue
			}
			t.Logf("%s: %v", proc, err)
		}
	}
}
