// Command ingress is Sluice's HTTP ingress: it matches requests to throttling rules, forwards
// what is allowed to the upstream, answers 429 to what is over its limit, and enqueues deferrable
// requests on NATS JetStream (202). With no `redis` and no `nats` section in its config it runs
// the whole system in one process: the quickstart.
//
//	go run ./cmd/ingress -config examples/quickstart.yaml
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluice-rl/sluice/internal/app"
	"github.com/sluice-rl/sluice/internal/connect"
	"github.com/sluice-rl/sluice/internal/gcfloor"
)

func main() {
	configPath := flag.String("config", "sluice.yaml", "the config file")
	healthcheck := flag.String("healthcheck", "", "GET this URL, exit 0 on 200 and 1 otherwise (container health checks)")
	flag.Parse()
	if *healthcheck != "" {
		os.Exit(connect.Probe(*healthcheck))
	}
	gcfloor.Set(gcfloor.Default) // fewer collections of a small heap; GOGC overrides
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := app.Ingress{ConfigPath: *configPath}.Run(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(connect.ExitCode(err))
}
