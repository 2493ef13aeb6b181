package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/connect"
	"github.com/sluice-rl/sluice/queue"
)

// check validates a config file as the processes would load it, prints each warning, and,
// unless -offline, asks the servers it names whether they can run it: Redis answers, keeps
// Sluice's keys (no eviction) and runs Lua; NATS lets the config's user use the subjects Sluice
// needs (queue.CheckPermissions), has JetStream (in nats.jetstream_domain, if set: the domain
// that answered is printed), is clustered when the streams ask for replicas (unchecked through
// a domain), and may store what the queues reserve. It returns errUsage-wrapped errors
// for a file that does not load (exit 2), and a plain error when a server cannot run it (exit 1).
func check(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	path := fs.String("config", "", "the config file")
	offline := fs.Bool("offline", false, "check the file only, not its servers")
	if err := fs.Parse(args); err != nil || *path == "" || fs.NArg() > 0 {
		return usageErr("check needs -config FILE [-offline]")
	}
	data, err := os.ReadFile(*path)
	if err != nil {
		return fmt.Errorf("%w: %v", errInvalidConfig, err)
	}
	cfg, err := config.Parse(*path, data, getenv)
	if err != nil {
		return fmt.Errorf("%w: %v", errInvalidConfig, err)
	}
	fmt.Fprintf(out, "%s: valid (rules: %d, queues: %d)\n", *path, len(cfg.Rules), len(cfg.Queues))
	for _, w := range cfg.Warnings() {
		fmt.Fprintf(out, "warning: %s\n", w)
	}
	if *offline {
		return nil
	}
	var failed []error
	connect.RouteRedisLogs(slog.New(slog.NewTextHandler(io.Discard, nil))) // its dial retries: the error says it once
	if cfg.Redis == nil {
		fmt.Fprintln(out, "redis: none configured: limiter state in memory, one process only")
	} else if err := checkRedis(ctx, cfg.Redis.URL, out); err != nil {
		failed = append(failed, err)
	}
	if cfg.NATS == nil {
		fmt.Fprintf(out, "nats: none configured: an embedded server stores the jobs under %s\n", cfg.DataDir)
	} else if err := checkNATS(ctx, cfg, out); err != nil {
		failed = append(failed, err)
	}
	return errors.Join(failed...)
}

// errInvalidConfig marks a file that does not load; run exits 2 for it.
var errInvalidConfig = errors.New("the config does not load")

func checkRedis(ctx context.Context, url string, out io.Writer) error {
	rdb, err := connect.Redis(url)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		if connect.RefusedCredentials(err) {
			return fmt.Errorf("redis: redis.url: the server refused the credentials: %w", err)
		}
		return fmt.Errorf("redis: no answer: %w", err)
	}
	unchecked, err := connect.CheckEviction(ctx, rdb)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if err := rdb.Eval(ctx, "return 1", nil).Err(); err != nil {
		return fmt.Errorf("redis: cannot run Lua scripts, which every limiter decision is: %w", err)
	}
	note := "keeps its keys, runs Lua"
	if len(unchecked) > 0 {
		note = fmt.Sprintf("runs Lua; eviction policy unchecked on %v (CONFIG GET refused): make sure it is noeviction", unchecked)
	}
	fmt.Fprintf(out, "redis: ok: %s\n", note)
	return nil
}

func checkNATS(ctx context.Context, cfg *config.Config, out io.Writer) error {
	nc, err := nats.Connect(cfg.NATS.URL, nats.Name("sluice-check"), nats.Timeout(5*time.Second),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})) // a permissions violation: reported once, below
	if err != nil {
		return fmt.Errorf("nats %s: %w", connect.RedactURL(cfg.NATS.URL), err)
	}
	defer nc.Close()
	names := make([]string, len(cfg.Queues))
	for i, q := range cfg.Queues {
		names[i] = q.Name
	}
	js, err := connect.JetStream(nc, cfg.NATS.JetStreamDomain) // the processes' context, in nats.jetstream_domain
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = queue.CheckPermissions(pctx, js, names)
	cancel()
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	info, err := js.AccountInfo(ctx)
	if err != nil {
		if d := cfg.NATS.JetStreamDomain; d != "" {
			return fmt.Errorf("nats: JetStream in domain %q does not answer through the servers of nats.url (is the leaf node connected to a hub of that domain, spelled as its jetstream { domain }?): %w", d, err)
		}
		return fmt.Errorf("nats: JetStream does not answer (is the server started with -js? behind a leaf node, set nats.jetstream_domain to the domain of the JetStream that holds the queues): %w", err)
	}
	// Through a domain the server connected to may be a leaf node, standalone while the
	// domain's servers are a cluster: the streams' creation tells then (explainOpen).
	if cfg.NATS.Replicas > 1 && cfg.NATS.JetStreamDomain == "" && nc.ConnectedClusterName() == "" {
		return fmt.Errorf("nats: nats.replicas is %d but the server is not part of a cluster: set nats.replicas: 1, or run a JetStream cluster of at least %d servers",
			cfg.NATS.Replicas, cfg.NATS.Replicas)
	}
	var reserve int64
	for _, q := range cfg.Queues {
		reserve += q.MaxBytes * int64(cfg.NATS.Replicas)
	}
	if limit := info.Limits.MaxStore; limit > 0 && reserve > limit-int64(info.Store) {
		return fmt.Errorf("nats: the queues' max_bytes (times nats.replicas) reserve %d bytes, more than the %d the account may still store: lower max_bytes, or raise the server's max_file_store",
			reserve, limit-int64(info.Store))
	}
	what := "JetStream"
	if info.Domain != "" { // the domain that answered: a leaf node's own, when nats.jetstream_domain is unset
		what = fmt.Sprintf("JetStream in domain %q", info.Domain)
	}
	fmt.Fprintf(out, "nats: ok: %s, the user's permissions, %d streams, the queues reserve %d MiB\n", what, info.Streams, reserve>>20)
	return nil
}
