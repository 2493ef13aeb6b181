package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"
)

// errUsage marks a command line that cannot be run; run prints the usage and exits 2.
var errUsage = errors.New("usage")

func usageErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, a...))
}

const usage = `usage: sluice [--admin URL] [--token T] [--json] [--timeout D] COMMAND [ARGS]

commands:
  queues                 list queues
  queue Q                show one queue (a fair queue: with its deepest tenants)
  tenant Q TENANT        show a tenant of fair queue Q (its id, or its value)
  pause Q [--for 30s]    stop deliveries of Q on every worker
  resume Q               restart deliveries of Q
  rate Q 40/s|file       set Q's rate at run time, or restore the config file's
  dlq list Q             list Q's dead letters
  dlq replay Q [ID...]   replay dead letters (all, or the IDs)
  dlq purge Q [ID...]    delete dead letters (all, or the IDs)
  job get ID             show a job
  job cancel ID          cancel a job that has not been delivered
  jobs Q [--state S] [--tenant T] [--limit N] [--cursor C] [--all]
                         list Q's jobs by state (queued, running, retrying, failed,
                         succeeded, canceled, all), a page at a time
  regions                each global queue's regional leases: share, expiry, demand
  top [--every 2s] [--frames N]
                         the queues, refreshed in the terminal (N frames, 0: until ^C)
  check -config FILE [-offline]
                         validate a config file, print its warnings, and ask its Redis
                         and NATS whether they can run it (exit 2: invalid, 1: a server can't)

Global options may stand anywhere. --admin defaults to $SLUICE_ADMIN_URL or
http://127.0.0.1:9090, --token to $SLUICE_ADMIN_TOKEN.
`

// run runs the command line args and returns the exit status: 0, 1 for a failed command, 2 for
// a usage error.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sluice", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	adminURL := fs.String("admin", firstNonEmpty(getenv("SLUICE_ADMIN_URL"), "http://127.0.0.1:9090"), "admin API base URL")
	token := fs.String("token", getenv("SLUICE_ADMIN_TOKEN"), "admin token")
	asJSON := fs.Bool("json", false, "print the API's JSON")
	timeout := fs.Duration("timeout", 10*time.Second, "time limit of the command")
	globals, rest := hoistGlobals(args)
	if err := fs.Parse(globals); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, usage)
			return 0
		}
		fmt.Fprintf(stderr, "sluice: %v\n%s", err, usage)
		return 2
	}
	if len(rest) > 0 && rest[0] == "check" { // the config file and its servers, not the admin API
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		return exitStatus(check(ctx, rest[1:], getenv, stdout), stderr)
	}
	base, err := url.Parse(*adminURL)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		fmt.Fprintf(stderr, "sluice: --admin %q is not an http(s) URL\n", *adminURL)
		return 2
	}
	c := &cli{api: &api{base: base, token: *token}, json: *asJSON, out: stdout}
	var err2 error
	if len(rest) > 0 && rest[0] == "top" { // runs on; --timeout bounds each frame
		err2 = c.top(ctx, rest[1:], *timeout)
	} else {
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		err2 = c.dispatch(ctx, rest)
	}
	return exitStatus(err2, stderr)
}

// exitStatus prints err and returns the exit status for it: 0 for none, 2 for a usage error
// or a config that does not load, 1 otherwise.
func exitStatus(err error, stderr io.Writer) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "sluice: %s\n%s", strings.TrimPrefix(err.Error(), "usage: "), usage)
		return 2
	case errors.Is(err, errInvalidConfig):
		fmt.Fprintf(stderr, "%v\n", strings.TrimPrefix(err.Error(), errInvalidConfig.Error()+": "))
		return 2
	}
	fmt.Fprintf(stderr, "sluice: %v\n", err)
	return 1
}

// globalFlags are the options every command takes, with whether each takes a value.
var globalFlags = map[string]bool{"admin": true, "token": true, "json": false, "timeout": true, "help": false, "h": false}

// hoistGlobals splits args into the global options, wherever they stand (before or after the
// command and its arguments, as -x or --x, with =value or the value next), and the rest in
// order; "--" ends the options.
func hoistGlobals(args []string) (globals, rest []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return globals, append(rest, args[i+1:]...)
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		takesValue, global := globalFlags[name]
		if !strings.HasPrefix(a, "-") || (!global && len(rest) > 0) { // an unknown option before the command is a usage error
			rest = append(rest, a)
			continue
		}
		globals = append(globals, a)
		if takesValue && !hasValue && i+1 < len(args) {
			globals, i = append(globals, args[i+1]), i+1
		}
	}
	return globals, rest
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// cli runs one command and prints its result.
type cli struct {
	api  *api
	json bool
	out  io.Writer
}

func (c *cli) dispatch(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usageErr("no command")
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "queues":
		return c.queues(ctx, rest)
	case "queue":
		return c.queue(ctx, rest)
	case "tenant":
		return c.tenant(ctx, rest)
	case "pause":
		return c.pause(ctx, rest)
	case "resume":
		return c.resume(ctx, rest)
	case "rate":
		return c.rate(ctx, rest)
	case "dlq":
		return c.dlq(ctx, rest)
	case "job":
		return c.job(ctx, rest)
	case "jobs":
		return c.jobs(ctx, rest)
	case "regions":
		return c.regions(ctx, rest)
	case "help":
		fmt.Fprint(c.out, usage)
		return nil
	}
	return usageErr("unknown command %q", cmd)
}

// exactly checks that args has n arguments, named by names for the message.
func exactly(cmd string, args []string, names ...string) error {
	if len(args) != len(names) {
		return usageErr("%s needs %s", cmd, strings.Join(names, " "))
	}
	return nil
}

func (c *cli) queues(ctx context.Context, args []string) error {
	if err := exactly("queues", args); err != nil {
		return err
	}
	var body struct {
		Queues []queueView `json:"queues"`
	}
	raw, err := c.api.call(ctx, "GET", "/v1/queues", nil, &body)
	if err != nil || c.json {
		return c.printRaw(raw, err)
	}
	return printQueues(c.out, body.Queues)
}

func (c *cli) queue(ctx context.Context, args []string) error {
	if err := exactly("queue", args, "QUEUE"); err != nil {
		return err
	}
	return c.showQueue(ctx, "GET", "/v1/queues/"+url.PathEscape(args[0]), nil)
}

// showQueue calls the API and prints the queue it answers with.
func (c *cli) showQueue(ctx context.Context, method, path string, body any) error {
	var q queueView
	raw, err := c.api.call(ctx, method, path, body, &q)
	if err != nil || c.json {
		return c.printRaw(raw, err)
	}
	if err := printQueues(c.out, []queueView{q}); err != nil || len(q.TopTenants) == 0 {
		return err
	}
	fmt.Fprintln(c.out)
	return printTenants(c.out, q.TopTenants)
}

func (c *cli) tenant(ctx context.Context, args []string) error {
	if err := exactly("tenant", args, "QUEUE", "TENANT"); err != nil {
		return err
	}
	var tv tenantView
	raw, err := c.api.call(ctx, "GET", "/v1/queues/"+url.PathEscape(args[0])+"/tenants/"+url.PathEscape(args[1]), nil, &tv)
	if err != nil || c.json {
		return c.printRaw(raw, err)
	}
	return printTenants(c.out, []tenantView{tv})
}

func (c *cli) pause(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("pause", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	d := fs.Duration("for", 0, "pause for this long (0: until resumed)")
	// Accept the option before or after the queue name.
	var names []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return usageErr("pause: %v", err)
		}
		args = fs.Args()
		if len(args) > 0 {
			names, args = append(names, args[0]), args[1:]
		}
	}
	if err := exactly("pause", names, "QUEUE"); err != nil {
		return err
	}
	if *d < 0 {
		return usageErr("pause: --for must not be negative")
	}
	path := "/v1/queues/" + url.PathEscape(names[0]) + "/pause"
	if *d > 0 {
		path += "?for=" + url.QueryEscape(d.String())
	}
	return c.showQueue(ctx, "POST", path, nil)
}

func (c *cli) resume(ctx context.Context, args []string) error {
	if err := exactly("resume", args, "QUEUE"); err != nil {
		return err
	}
	return c.showQueue(ctx, "POST", "/v1/queues/"+url.PathEscape(args[0])+"/resume", nil)
}

func (c *cli) rate(ctx context.Context, args []string) error {
	if err := exactly("rate", args, "QUEUE", "RATE"); err != nil {
		return err
	}
	// "file" (or "null") restores the configured rate: PATCH {"rate": null}.
	var rate any = args[1]
	if args[1] == "file" || args[1] == "null" {
		rate = nil
	}
	return c.showQueue(ctx, "PATCH", "/v1/queues/"+url.PathEscape(args[0]), map[string]any{"rate": rate})
}

func (c *cli) dlq(ctx context.Context, args []string) error {
	if len(args) < 2 {
		return usageErr("dlq needs list|replay|purge QUEUE")
	}
	sub, q, ids := args[0], args[1], args[2:]
	path := "/v1/queues/" + url.PathEscape(q) + "/dead-letters"
	var body any
	if len(ids) > 0 {
		body = map[string]any{"ids": ids}
	}
	switch sub {
	case "list":
		if len(ids) > 0 {
			return usageErr("dlq list takes only QUEUE")
		}
		var out struct {
			DeadLetters []deadLetterView `json:"dead_letters"`
		}
		raw, err := c.api.call(ctx, "GET", path, nil, &out)
		if err != nil || c.json {
			return c.printRaw(raw, err)
		}
		return printDeadLetters(c.out, out.DeadLetters)
	case "replay", "purge":
		method, verb := "POST", "replayed"
		if sub == "replay" {
			path += "/replay"
		} else {
			method, verb = "DELETE", "purged"
		}
		var out map[string]any
		raw, err := c.api.call(ctx, method, path, body, &out)
		if err != nil || c.json {
			return c.printRaw(raw, err)
		}
		fmt.Fprintf(c.out, "%s %v dead letters of %s\n", verb, out[verb], q)
		return nil
	}
	return usageErr("unknown dlq command %q", sub)
}

func (c *cli) job(ctx context.Context, args []string) error {
	if len(args) != 2 || (args[0] != "get" && args[0] != "cancel") {
		return usageErr("job needs get|cancel ID")
	}
	method := "GET"
	if args[0] == "cancel" {
		method = "DELETE"
	}
	var j jobView
	raw, err := c.api.call(ctx, method, "/v1/jobs/"+url.PathEscape(args[1]), nil, &j)
	if err != nil || c.json {
		return c.printRaw(raw, err)
	}
	return printJob(c.out, j)
}

// printRaw prints the API's JSON as it came (for --json), or returns err.
func (c *cli) printRaw(raw []byte, err error) error {
	if err != nil {
		return err
	}
	var v any
	if json.Unmarshal(raw, &v) == nil {
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	_, err = c.out.Write(raw)
	return err
}
