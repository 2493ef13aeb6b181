// Package connect holds what the two Sluice processes (ingress and worker) share about being a
// process: a go-redis client for the config's redis section (one server or a Redis Cluster),
// each of whose commands ends within CallTimeout, with its logs routed to the process's logger, and the check that the Redis will not evict
// Sluice's keys ([CheckEviction]); a NATS connection for its nats section, with the timeouts
// and reconnect behaviour both want, and the JetStream context over it, in the config's
// JetStream domain ([JetStream]); the exit-status convention for configuration errors
// ([ConfigError], [ExitCode]); and the health probe of the container images ([Probe]).
package connect

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/config"
)

// Redis returns a client for a redis:// or rediss:// URL (user, password and db included), or,
// for a URL that lists several host:port seeds separated by commas, a Redis Cluster client.
// It does not dial: the first command does.
//
// Every command (or pipeline) ends within CallTimeout, or by its context's deadline when that
// is sooner: the bound covers the wait for a pooled connection, the dial and go-redis's own
// retries, not each of them. A Redis that stopped answering (black-holed packets, a SIGSTOPped
// server) thus costs a call CallTimeout, never the several seconds go-redis's dial retries
// (DialerRetries, 5 by default, each of DialTimeout) and command retries (MaxRetries) add up to
// without a deadline; a dial is tried once per command attempt (DialerRetries 1), and the
// command's retries — a connection the server closed — fit inside the bound.
func Redis(url string) (redis.UniversalClient, error) {
	seeds, cluster, err := config.ParseRedisSeeds(url)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	if cluster {
		opts := &redis.ClusterOptions{
			Addrs: seeds.Addrs, Username: seeds.User, Password: seeds.Password,
			DialTimeout: CallTimeout, ReadTimeout: CallTimeout, WriteTimeout: CallTimeout,
			PoolTimeout: CallTimeout, DialerRetries: 1, ContextTimeoutEnabled: true,
		}
		if seeds.TLS {
			opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		c := redis.NewClusterClient(opts)
		c.AddHook(boundCalls{CallTimeout})
		c.AddHook(reloadOnFailure{c}) // a failover is learned in 200 ms, not a minute (cluster.go)
		return c, nil
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	if opts.DialTimeout == 0 {
		opts.DialTimeout = CallTimeout
	}
	if opts.ReadTimeout == 0 {
		opts.ReadTimeout = CallTimeout
	}
	if opts.WriteTimeout == 0 {
		opts.WriteTimeout = CallTimeout
	}
	if opts.PoolTimeout == 0 {
		opts.PoolTimeout = CallTimeout
	}
	if opts.DialerRetries == 0 {
		opts.DialerRetries = 1
	}
	opts.ContextTimeoutEnabled = true
	c := redis.NewClient(opts)
	c.AddHook(boundCalls{CallTimeout})
	return c, nil
}

// RefusedCredentials reports whether err is Redis refusing a connection's credentials: a
// wrong user or password (WRONGPASS, or ERR invalid password from servers before ACLs), or
// none given to a server that wants one (NOAUTH). No retry mends it: the processes refuse to
// start on it, naming redis.url, and `sluice check` says so.
func RefusedCredentials(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "WRONGPASS") || strings.HasPrefix(msg, "NOAUTH") ||
		strings.HasPrefix(msg, "ERR invalid password") || strings.HasPrefix(msg, "ERR AUTH")
}

// RedactURL is a server URL (or several, separated by commas, as nats.url and a Redis
// Cluster's redis.url take them) with each user and password replaced by "redacted", for logs
// and error messages.
func RedactURL(raw string) string {
	parts := strings.Split(raw, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if u, err := url.Parse(p); err == nil && u.User != nil {
			u.User = url.User("redacted")
			p = u.String()
		}
		parts[i] = p
	}
	return strings.Join(parts, ",")
}

// CallTimeout is the longest a Redis command of a client of [Redis] takes, retries included,
// when its context allows longer: well above a round trip, and half the two seconds a worker
// waits for an unreachable Redis before it hands its jobs back (package worker), so that a
// black-holed call is noticed in time for that bound.
const CallTimeout = time.Second

// boundCalls is a go-redis hook that ends each command and pipeline within d, or by its
// context's deadline when that is sooner.
type boundCalls struct{ d time.Duration }

func (b boundCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (b boundCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		ctx, cancel := b.bound(ctx)
		defer cancel()
		return next(ctx, cmd)
	}
}

func (b boundCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		ctx, cancel := b.bound(ctx)
		defer cancel()
		return next(ctx, cmds)
	}
}

// bound is ctx with a deadline at most d away.
func (b boundCalls) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= b.d {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, b.d)
}

// NATS connects to url (comma-separated servers) as name. The connection retries in the
// background when no server answers yet and reconnects forever, so a process starts (and
// reports not ready) while NATS is down, and carries on when it returns.
// Its events (disconnects, reconnects, asynchronous errors) are logged to log.
func NATS(url, name string, log *slog.Logger) (*nats.Conn, error) {
	nc, err := nats.Connect(url,
		nats.Name(name),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats: disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats: reconnected", "server", c.ConnectedUrlRedacted()) }),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			log.Warn("nats: asynchronous error", "subject", subject, "err", err)
		}),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		// No reconnect buffer: a publish while disconnected fails at once (the ingress
		// answers 503 in milliseconds) instead of being held and sent after the reconnect,
		// when its caller has long been told that nothing was stored.
		nats.ReconnectBufSize(-1),
		// Notice a server that stopped answering without closing the connection within
		// seconds rather than minutes.
		nats.PingInterval(2*time.Second),
		nats.MaxPingsOutstanding(2),
	)
	if err != nil {
		return nil, fmt.Errorf("nats %s: %w", RedactURL(url), err)
	}
	return nc, nil
}

// JetStream is the JetStream context of a process over nc: on the API subjects of domain
// ("$JS.<domain>.API.>", jetstream.NewWithDomain; the config's nats.jetstream_domain), or on
// the servers' own ("$JS.API.>") when domain is empty. Everything the queue layer does through
// it (streams, consumers, key-value buckets, direct gets) and the permission probe follow
// that prefix (queue.APIPrefix). It does no I/O.
func JetStream(nc *nats.Conn, domain string) (jetstream.JetStream, error) {
	if domain == "" {
		return jetstream.New(nc)
	}
	return jetstream.NewWithDomain(nc, domain)
}

// RouteRedisLogs sends go-redis's own log lines (a pool that cannot dial, for one) to log
// instead of the standard logger, so that they come out structured among the process's other
// lines. go-redis has one logger per process: the last call wins.
func RouteRedisLogs(log *slog.Logger) { redis.SetLogger(redisLogger{log}) }

type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	l.log.Warn("redis: " + fmt.Sprintf(format, v...))
}

// Probe GETs url and returns 0 when it answers 200 within two seconds, 1 otherwise: the health
// check of the container images, which have no shell or curl.
func Probe(url string) int {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 1
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 1
	}
	return 0
}

// ErrConfig marks errors that come from the configuration: a file that cannot be read or is
// invalid, or one a process cannot run with. The commands exit with status 2 on them.
var ErrConfig = errors.New("configuration")

// configError is an ErrConfig whose message is only its cause's.
type configError struct{ err error }

func (e *configError) Error() string   { return e.err.Error() }
func (e *configError) Unwrap() []error { return []error{ErrConfig, e.err} }

// ConfigError marks err as an ErrConfig without changing its message.
func ConfigError(err error) error { return &configError{err} }

// ExitCode is the process exit status for the error a process's Run returned: 0 for nil, 2 for
// an ErrConfig, 1 otherwise.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrConfig):
		return 2
	default:
		return 1
	}
}
