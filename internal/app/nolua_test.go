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
