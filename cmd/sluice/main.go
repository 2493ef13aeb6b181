// Command sluice is the command-line client of Sluice's operating API, the admin listener of an
// ingress (admin_listen). It reads queues, tenants, dead letters and jobs, and steers a running
// deployment: pause and resume a queue on every worker, set its rate at run time, replay or purge
// dead letters, cancel a job.
//
//	sluice [--admin URL] [--token T] [--json] [--timeout D] COMMAND [ARGS]
//
//	queues                 every queue
//	queue Q                one queue (a fair queue: with its deepest tenants)
//	tenant Q TENANT        one tenant of fair queue Q (its id, or its value)
//	pause Q [--for 30s]    stop deliveries of Q on every worker (until resumed, or for a while)
//	resume Q               restart deliveries of Q
//	rate Q 40/s|file       set Q's rate at run time, or restore the config file's
//	dlq list Q             Q's dead letters
//	dlq replay Q [ID…]     put dead letters (all, or the IDs) back into Q with fresh attempts
//	dlq purge Q [ID…]      delete dead letters (all, or the IDs)
//	job get ID             a job's state
//	job cancel ID          cancel a job that has not been delivered
//	jobs Q [--state S] …   a page of Q's jobs by state
//	regions                each global queue's regional leases (share, expiry, demand)
//	top [--every 2s]       the queues, refreshed in the terminal
//	check -config FILE     validate a config file offline and against its Redis and NATS
//
// Global options may stand anywhere on the line (`sluice queue orders --json`). `sluice help`
// prints the full usage. --admin defaults to $SLUICE_ADMIN_URL, then
// http://127.0.0.1:9090; --token to $SLUICE_ADMIN_TOKEN. Output is an aligned table for people,
// or the API's JSON with --json. On an error sluice prints one line naming the reason to stderr
// and exits 1; a usage error exits 2.
//
// It uses the standard flag package rather than a CLI framework: a dozen commands with a few
// options each do not need one, and the binary stays a plain HTTP client.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}
