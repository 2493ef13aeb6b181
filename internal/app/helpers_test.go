package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/openapi/openapitest"
	"github.com/sluice-rl/sluice/internal/testenv"
	"go.uber.org/goleak"
)

// api validates every request the tests send to a started ingress, and its answer, against
// the OpenAPI documents (see start).
var api *openapitest.Validator

func TestMain(m *testing.M) {
	api = openapitest.Install()
	code := m.Run()
	// A full run must exercise every operation of both documents (TestOpenAPITour does).
	code = api.Finish(code, "job", "admin")
	if code == 0 {
		if err := goleak.Find(
			// The embedded NATS server and go-redis keep a few process-wide goroutines.
			goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
			goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
			goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// running is an ingress process started in-process for a test.
type running struct {
	listen, admin string
	// publicRoutes and adminRoutes are the routes the job API and the admin listener serve.
	publicRoutes, adminRoutes []string
	cancel                    context.CancelFunc
	done                      chan error
}

// start runs app.Ingress with the config text cfg (written to a temp file) until the test ends
// or stop is called.
func start(t *testing.T, dir, cfg string) *running {
	t.Helper()
	return startWithin(t, dir, cfg, 60*time.Second)
}

// startWithin is start, failing the test when the ingress is not ready within timeout.
func startWithin(t *testing.T, dir, cfg string, timeout time.Duration) *running {
	t.Helper()
	path := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	ready := make(chan struct{})
	go func() {
		r.done <- Ingress{
			ConfigPath: path,
			Logger:     testLogger(),
			routes:     func(public, admin []string) { r.publicRoutes, r.adminRoutes = public, admin },
			Ready: func(listen, admin string) {
				r.listen, r.admin = listen, admin
				close(ready)
			},
		}.Run(ctx)
	}()
	select {
	case <-ready:
	case err := <-r.done:
		cancel()
		t.Fatalf("ingress exited during start-up: %v", err)
	case <-time.After(timeout):
		cancel()
		t.Fatalf("ingress not ready after %v", timeout)
	}
	t.Cleanup(r.stop)
	api.Serve(t, "job", r.listen)
	api.Serve(t, "admin", r.admin)
	return r
}

// stop shuts the ingress down gracefully and checks that Run returned nil.
func (r *running) stop() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	if err := <-r.done; err != nil {
		panic(fmt.Sprintf("ingress Run returned %v after shutdown", err))
	}
}

// freeAddr returns a free loopback host:port.
func freeAddr(t *testing.T) string { return fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)) }

// quickstart returns examples/quickstart.yaml with its addresses replaced by free ones and its
// data under dir, and the replacements made.
func quickstart(t *testing.T, dir string) (string, *strings.Replacer) {
	t.Helper()
	b, err := os.ReadFile("../../examples/quickstart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	addrs := strings.NewReplacer(
		"127.0.0.1:8080", freeAddr(t),
		"127.0.0.1:9090", freeAddr(t),
		"127.0.0.1:9000", freeAddr(t),
		"./data", filepath.Join(dir, "data"),
	)
	return addrs.Replace(string(b)), addrs
}

// testLogger discards the process's logs unless SLUICE_TEST_LOG=1.
func testLogger() *slog.Logger {
	if os.Getenv("SLUICE_TEST_LOG") == "1" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
