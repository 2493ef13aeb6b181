// Command worker drains Sluice's queues: it takes jobs from NATS JetStream, waits for each
// queue's shared leak slot (coordinated in Redis), and delivers them to the upstream. Start any
// number of workers, on any number of machines:
//
//	go run ./cmd/worker -config sluice.yaml
//
// The config file is the ingress's; the worker needs its `nats` and `redis` sections (or
// SLUICE_NATS_URL and SLUICE_REDIS_URL) and serves only /healthz, /readyz and /metrics on
// admin_listen (SLUICE_ADMIN_LISTEN sets workers on one host apart). SIGHUP, or a change of the
// file, reloads it; SIGTERM or SIGINT stops the worker gracefully within shutdown_timeout.
//
// Exit status: 0 after a graceful shutdown, 2 for an unusable config, 1 for other failures.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluice-rl/sluice/internal/app"
	"github.com/sluice-rl/sluice/internal/connect"
	"github.com/sluice-rl/sluice/internal/gcfloor"
)

func main() {
	path := flag.String("config", "sluice.yaml", "the config `file`")
	healthcheck := flag.String("healthcheck", "", "GET this `URL`, exit 0 on 200 and 1 otherwise (container health checks)")
	flag.Parse()
	if *healthcheck != "" {
		os.Exit(connect.Probe(*healthcheck))
	}
	gcfloor.Set(gcfloor.Default) // fewer collections of a small heap; GOGC overrides

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := app.Worker{
		ConfigPath: *path,
		Logger:     slog.New(slog.NewTextHandler(os.Stderr, nil)),
	}.Run(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	stop()
	os.Exit(connect.ExitCode(err))
}
