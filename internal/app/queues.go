package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/connect"
	"github.com/sluice-rl/sluice/internal/ingress"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/queue"
	"github.com/sluice-rl/sluice/retry"
)

// openPolicy spaces the attempts of openQueues: 100ms doubling to 5s, each ±50% so that the
// workers of a fleet that lost NATS together do not come back in step.
var openPolicy = retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.5}

// openTimeout bounds the first step of an attempt of openQueues (queue.New: the status
// bucket). nats-server answers its lookup only when no other JetStream request waits, so a
// process that starts beside others creating thousands of queues waits for their creations to
// end (queue.infoWait): a shorter bound failed it, and it started over, after they had ended.
const openTimeout = time.Minute

// openQueues creates the queue layer over js (the process's JetStream context, in the
// config's JetStream domain: newJetStream) and provisions the current config's queues,
// retrying while NATS cannot be reached (openPolicy) until ctx ends: the one connect policy
// of the ingress and the worker. proc names the process in the logs; url (redacted) names the
// servers in them while none answers; failed, if set, is told why each attempt failed.
func openQueues(ctx context.Context, proc string, js jetstream.JetStream, url string, current func() *config.Config, log *slog.Logger, failed func(error)) (*queue.Queues, error) {
	nc := js.Conn()
	var err error
	b := openPolicy.Backoff(nil)
	probed := current().NATS == nil // the embedded server: no users, nothing to probe
	for {
		if nc.IsClosed() && ctx.Err() == nil {
			return nil, closedForGood(current().Path, url, nc.LastError())
		}
		if !nc.IsConnected() {
			err = fmt.Errorf("no NATS server answers at %s (connection %s)", connect.RedactURL(url), nc.Status())
		} else if !probed {
			if err = checkPermissions(ctx, js, current()); err == nil {
				probed = true
				continue
			}
			if errors.Is(err, queue.ErrPermission) {
				return nil, configErrf("%s: nats.url: %w", current().Path, err)
			}
		} else {
			var qs *queue.Queues
			if qs, err = openQueuesOnce(ctx, js, current); err == nil {
				return qs, nil
			}
			var permanent bool
			if err, permanent = explainOpen(current(), err); permanent {
				return nil, err
			}
		}
		if failed != nil {
			failed(err)
		}
		wait, _ := b.Next(0) // never spent: openPolicy has no bound
		log.Warn(proc+": queues unavailable; retrying", "err", err, "retry_in", wait)
		if err := retry.Sleep(ctx, nil, wait); err != nil {
			return nil, err
		}
	}
}

// closedForGood is why openQueues stops when nats.go closed the connection for good: it
// reconnects forever (connect.NATS) except when a server refuses its credentials (twice in a
// row: an authorization violation, expired or revoked credentials), which no retry mends. A
// refusal is a config error naming nats.url; any other close is an error of its own. The URL is
// redacted: the password is not written.
func closedForGood(path, url string, last error) error {
	if last == nil {
		last = errors.New("closed")
	}
	for _, auth := range []error{nats.ErrAuthorization, nats.ErrAuthExpired, nats.ErrAuthRevoked} {
		if errors.Is(last, auth) || strings.Contains(strings.ToLower(last.Error()), strings.ToLower(strings.TrimPrefix(auth.Error(), "nats: "))) {
			return configErrf("%s: nats.url: the NATS server at %s refused the credentials: %w", path, connect.RedactURL(url), last)
		}
	}
	return fmt.Errorf("the NATS connection to %s closed for good: %w", connect.RedactURL(url), last)
}

// newJetStream is the JetStream context of a process over nc, for cfg: in its
// nats.jetstream_domain, if any (connect.JetStream); the embedded server has no domain.
func newJetStream(nc *nats.Conn, cfg *config.Config) (jetstream.JetStream, error) {
	js, err := connect.JetStream(nc, jsDomain(cfg))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return js, nil
}

// checkPermissions asks the NATS server whether the user of js's connection may do what Sluice
// does through js with cfg's queues (queue.CheckPermissions), waiting for its answer a few
// seconds at most.
func checkPermissions(ctx context.Context, js jetstream.JetStream, cfg *config.Config) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return queue.CheckPermissions(ctx, js, queueNames(cfg))
}

// explainOpen turns a failed opening of the queues into what the log and /readyz say: the
// queues that could not be provisioned, the cause and its fix (a server that answers without
// JetStream: its -js flag, or the domain of a leaf node's hub). permanent says that retrying
// cannot help (replicas above what the NATS servers run): the process stops with a config
// error rather than report not ready for ever.
func explainOpen(cfg *config.Config, err error) (_ error, permanent bool) {
	if errors.Is(err, queue.ErrNoCluster) {
		return configErrf("%s: nats.replicas is %d, but the NATS server runs JetStream without a cluster: "+
			"set nats.replicas: 1 or run a cluster of at least %d servers (%s)", cfg.Path, replicas(cfg), replicas(cfg), firstCause(err)), true
	}
	if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
		// Retried: JetStream may be enabled while the process waits.
		return fmt.Errorf("%w: start nats-server with JetStream (-js, or a jetstream block), enable it for the account, "+
			"or, when the server is a leaf node of the servers that hold the queues, set nats.jetstream_domain to "+
			"their JetStream domain (docs/operating.md, \"Leaf nodes and JetStream domains\")", err), false
	}
	var failed []string
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if pe := (*queue.ProvisionError)(nil); errors.As(e, &pe) {
				failed = append(failed, pe.Queue)
			}
		}
	}
	if len(failed) == 0 {
		return err, false
	}
	fix := ""
	if errors.Is(err, queue.ErrNoStore) {
		fix = ": the NATS server's store cannot reserve their max_bytes (JetStream reserves a stream's " +
			"max_bytes when it creates it): lower their max_bytes or nats.store_budget, or leave both unset " +
			"(a queue without max_bytes reserves nothing), or give nats-server a larger store " +
			"(jetstream { max_file_store })"
	}
	return fmt.Errorf("%d of %d queues cannot be provisioned (%s)%s; first: %s",
		len(failed), len(cfg.Queues), quoteSome(failed, 5), fix, firstCause(err)), false
}

// firstCause is the first error of a join, whole.
func firstCause(err error) error {
	if j, ok := err.(interface{ Unwrap() []error }); ok && len(j.Unwrap()) > 0 {
		return j.Unwrap()[0]
	}
	return err
}

// quoteSome is up to n of names, quoted, and how many more there are.
func quoteSome(names []string, n int) string {
	q := make([]string, 0, min(n, len(names)))
	for _, name := range names[:min(n, len(names))] {
		q = append(q, strconv.Quote(name))
	}
	s := strings.Join(q, ", ")
	if len(names) > n {
		s += fmt.Sprintf(" and %d more", len(names)-n)
	}
	return s
}

// openQueuesOnce is one attempt of openQueues. A reload applied while it provisioned is
// provisioned too, so that the queues opened are the current config's. Provision bounds each
// queue's steps by itself: one bound for the whole of thousands of queues would cut a slow
// server's start short and start over.
func openQueuesOnce(pctx context.Context, js jetstream.JetStream, current func() *config.Config) (*queue.Queues, error) {
	ctx, cancel := context.WithTimeout(pctx, openTimeout)
	defer cancel()
	cfg := current()
	qs, err := queue.New(ctx, js, QueueOptions(cfg))
	if err != nil {
		return nil, err
	}
	ctx = pctx
	if cfg.NATS == nil {
		// The quickstart: this process is the only consumer. The jobs its pool handed back at
		// the last shutdown are pending in the consumer's stored state until their ack wait
		// runs out; a fresh consumer delivers every unacked job at once, in order.
		if err := qs.ResetConsumers(ctx, queueNames(cfg)); err != nil {
			return nil, err
		}
	}
	for {
		if err := qs.Provision(ctx, QueueSpecs(cfg)); err != nil {
			return nil, err
		}
		if next := current(); next != cfg {
			cfg = next
			continue
		}
		return qs, nil
	}
}

// QueueSpecs maps the queues of cfg to the queue layer's specs. Every process that provisions
// the queues (ingresses and workers) derives them from the same file, so they agree.
func QueueSpecs(cfg *config.Config) []queue.Spec {
	out := make([]queue.Spec, 0, len(cfg.Queues))
	for _, q := range cfg.Queues {
		out = append(out, queue.Spec{
			Name:         q.Name,
			MaxDepth:     q.MaxDepth,
			MaxBodyBytes: q.MaxBodyBytes,
			MaxBytes:     q.MaxBytes,
			DedupeWindow: q.DedupeWindow,
			// The ledger holds tenant_max_depth exactly, scheduled jobs included.
			TenantMaxDepth: q.TenantMaxDepth,
			Replicas:       replicas(cfg),
			AckWait:        q.AckWait,
			Fair:           q.Fair,
			Priorities:     q.Priorities,
		})
	}
	return out
}

// QueueOptions are the queue layer's options for cfg: its job retention, replicas, id secret
// and shared streams (none for the embedded server of a config without a nats section).
func QueueOptions(cfg *config.Config) queue.Options {
	opts := queue.Options{StatusTTL: cfg.JobRetention, Replicas: replicas(cfg), IDSecret: cfg.IDSecretBytes()}
	if cfg.NATS != nil {
		opts.SharedStreams = cfg.NATS.SharedStreams
	}
	return opts
}

// replicas is the stream replicas of cfg's queues: nats.replicas, 1 for the embedded server.
func replicas(cfg *config.Config) int {
	if cfg.NATS == nil {
		return 1
	}
	return cfg.NATS.Replicas
}

func queueNames(cfg *config.Config) []string {
	names := make([]string, len(cfg.Queues))
	for i, q := range cfg.Queues {
		names[i] = q.Name
	}
	return names
}

// pausedUntil adapts a leak schedule to the admin API's view of a queue's pause.
func pausedUntil(s leaky.Schedule) func(ctx context.Context, q string) (time.Time, bool, error) {
	return func(ctx context.Context, q string) (time.Time, bool, error) {
		d, err := s.PausedFor(ctx, q)
		if err != nil || d <= 0 {
			return time.Time{}, false, err
		}
		return time.Now().Add(d), true, nil
	}
}

// drainOf tells the ingress how a queue drains now, for eta (ingress.Options.Drain), as the
// admin API reads it: the operators' control (runtime rate, pause), an upstream's pause in the
// leak schedule, and the rate the workers learned for an adaptive queue. What cannot be read is
// left out: an estimate does not fail for it.
func drainOf(control func(ctx context.Context, q string) (queue.Control, error), s leaky.Schedule,
	current func() *config.Config) func(ctx context.Context, q string) (ingress.Drain, error) {
	return func(ctx context.Context, q string) (ingress.Drain, error) {
		var d ingress.Drain
		now := time.Now()
		if c, err := control(ctx, q); err == nil {
			if r, err := config.ParseRate(c.Rate); c.Rate != "" && err == nil {
				d.Rate = r.PerSecond()
			}
			if c.PausedAt(now) {
				d.PausedUntil, d.Indefinite = c.PausedUntil, c.PausedUntil.IsZero()
			}
		}
		if p, err := s.PausedFor(ctx, q); err == nil && p > 0 && now.Add(p).After(d.PausedUntil) {
			d.PausedUntil = now.Add(p)
		}
		ad, ok := s.(leaky.Adapter)
		cq, found := current().Queue(q)
		if !ok || !found || !cq.Adaptive {
			return d, nil
		}
		if eff, ok, err := ad.Learned(ctx, q); err == nil && ok {
			ceiling := d.Rate
			if ceiling == 0 {
				ceiling = cq.Rate.PerSecond()
			}
			d.Rate = min(eff, ceiling)
		}
		return d, nil
	}
}
