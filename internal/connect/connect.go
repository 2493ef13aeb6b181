// Package connect holds what the two Sluice processes (ingress and worker) share about being a
// process: a go-redis client for the config's redis section (one server or a Redis Cluster),
// with its logs routed to the process's logger, and the check that the Redis will not evict
// Sluice's keys ([CheckEviction]); a NATS connection for its nats section, with the timeouts
// and reconnect behaviour both want; the exit-status convention for configuration errors
// ([ConfigError], [ExitCode]); and the health probe of the container images ([Probe]).
package connect

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/config"
)

// Redis returns a client for a redis:// or rediss:// URL (user, password and db included), or,
// for a URL that lists several host:port seeds separated by commas, a Redis Cluster client.
// Every command is bounded by its context (ContextTimeoutEnabled) and by one-second socket
// timeouts when the caller set no deadline, so a dead Redis cannot hang a request. It does not
// dial: the first command does.
func Redis(url string) (redis.UniversalClient, error) {
	seeds, cluster, err := config.ParseRedisSeeds(url)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	if cluster {
		opts := &redis.ClusterOptions{
			Addrs: seeds.Addrs, Username: seeds.User, Password: seeds.Password,
			DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
			ContextTimeoutEnabled: true,
		}
		if seeds.TLS {
			opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		return redis.NewClusterClient(opts), nil
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	if opts.DialTimeout == 0 {
		opts.DialTimeout = time.Second
	}
	if opts.ReadTimeout == 0 {
		opts.ReadTimeout = time.Second
	}
	if opts.WriteTimeout == 0 {
		opts.WriteTimeout = time.Second
	}
	opts.ContextTimeoutEnabled = true
	return redis.NewClient(opts), nil
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
		return nil, fmt.Errorf("nats %s: %w", url, err)
	}
	return nc, nil
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
