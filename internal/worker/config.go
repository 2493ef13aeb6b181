package worker

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/retry"
)

// Defaults of a QueueConfig's zero fields.
const (
	DefaultMaxAttempts     = 8
	DefaultTimeout         = 10 * time.Second
	DefaultConcurrency     = 4
	DefaultMaxPauseRetries = 20
	// DefaultPause is how long a queue pauses after an upstream 429 or 503 that named no wait
	// (no Retry-After, RateLimit or X-RateLimit-Reset header).
	DefaultPause = time.Second
	// DefaultAckWait is the AckWait the queue package gives a queue's consumer by default.
	DefaultAckWait = 30 * time.Second
	// DefaultShutdownTimeout bounds a graceful shutdown when Deps.ShutdownTimeout is zero.
	DefaultShutdownTimeout = 10 * time.Second
)

// QueueConfig is how a worker drains one queue. The zero value of each field, other than
// Name and Rate, means its default.
type QueueConfig struct {
	// Name is the queue's name. Required.
	Name string
	// Rate is the queue's leak rate, shared by every worker of every process through the
	// leak schedule. Required: Rate.Interval > 0.
	Rate leaky.Rate
	// Upstream is the absolute base URL that deferred jobs (a request's method, path and
	// query) are delivered to: Upstream + Job.Path. "": deferred jobs of this queue fail
	// permanently.
	Upstream string
	// Target is where directly submitted jobs are delivered. Nil: direct jobs of this queue
	// fail permanently.
	Target *Target
	// MaxAttempts is how many delivery attempts a job gets before it is dead-lettered; an
	// attempt is spent by every delivery except one the upstream answered with 429 or 503.
	// Default DefaultMaxAttempts (8).
	MaxAttempts int
	// Backoff spaces the retries of a failed attempt: attempt n is followed by
	// Backoff.Delay(n, rnd). Its MaxAttempts and MaxElapsed are ignored. The zero Policy is
	// retry's default (500ms doubling to 30s, ±50% jitter).
	Backoff retry.Policy
	// Timeout bounds one delivery attempt, from sending the request to reading the response
	// headers and draining the body. Default DefaultTimeout (10s).
	Timeout time.Duration
	// Concurrency is how many jobs of this queue one Pool holds at once: each waits for its
	// leak slot and then is delivered. It bounds both the in-flight deliveries and the
	// messages held unacknowledged. Default DefaultConcurrency (4).
	Concurrency int
	// MaxPauseRetries is how many times a job is retried after a 429 or 503 without spending
	// an attempt; beyond it the job is dead-lettered. Default DefaultMaxPauseRetries (20); a
	// negative value allows none (the first 429 dead-letters the job).
	MaxPauseRetries int
	// DefaultPause is how long the queue pauses after a 429 or 503 without a wait in its
	// headers. Default DefaultPause (1s).
	DefaultPause time.Duration
	// AckWait is the queue consumer's AckWait; a job held longer than AckWait/3 (waiting for
	// its slot, or being delivered) is kept alive with InProgress every AckWait/3. Default
	// DefaultAckWait (30s), the queue package's default.
	AckWait time.Duration
}

// Target is the destination of a queue's directly submitted jobs.
type Target struct {
	// Method is the HTTP method; "" means POST.
	Method string
	// URL is an absolute http or https URL.
	URL string
}

// withDefaults returns c with every zero field set to its default.
func (c QueueConfig) withDefaults() QueueConfig {
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Concurrency <= 0 {
		c.Concurrency = DefaultConcurrency
	}
	switch {
	case c.MaxPauseRetries == 0:
		c.MaxPauseRetries = DefaultMaxPauseRetries
	case c.MaxPauseRetries < 0:
		c.MaxPauseRetries = 0
	}
	if c.DefaultPause <= 0 {
		c.DefaultPause = DefaultPause
	}
	if c.AckWait <= 0 {
		c.AckWait = DefaultAckWait
	}
	if c.Target != nil && c.Target.Method == "" {
		t := *c.Target
		t.Method = "POST"
		c.Target = &t
	}
	return c
}

// validate reports what makes c unusable.
func (c QueueConfig) validate() error {
	var errs []error
	if c.Name == "" {
		errs = append(errs, errors.New("name is required"))
	}
	if c.Rate.Interval <= 0 {
		errs = append(errs, errors.New("rate interval must be > 0"))
	}
	if c.Upstream != "" && !absHTTP(c.Upstream) {
		errs = append(errs, fmt.Errorf("upstream %q is not an absolute http(s) URL", c.Upstream))
	}
	if c.Target != nil && !absHTTP(c.Target.URL) {
		errs = append(errs, fmt.Errorf("target %q is not an absolute http(s) URL", c.Target.URL))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("worker: queue %q: %w", c.Name, err)
	}
	return nil
}

func absHTTP(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// FromConfig maps the queues of a config file to the worker's per-queue configs: the rate and
// burst to a leak rate, cfg.Upstream to every queue's Upstream, the queue's target, attempts,
// backoff, timeout, concurrency and max_pause_retries (0 in the file means none).
func FromConfig(cfg *config.Config) []QueueConfig {
	out := make([]QueueConfig, 0, len(cfg.Queues))
	for _, q := range cfg.Queues {
		qc := QueueConfig{
			Name:        q.Name,
			Rate:        leaky.Rate{Interval: q.Rate.Interval(), Burst: q.Burst},
			Upstream:    strings.TrimSpace(cfg.Upstream),
			MaxAttempts: q.MaxAttempts,
			Backoff:     retry.Policy{Initial: q.Backoff.Initial, Max: q.Backoff.Max},
			Timeout:     q.Timeout,
			Concurrency: q.Concurrency,
			AckWait:     q.AckWait,
			// The file's 0 means "no pause retries"; the worker's 0 means the default.
			MaxPauseRetries: q.MaxPauseRetries,
		}
		if q.MaxPauseRetries == 0 {
			qc.MaxPauseRetries = -1
		}
		if q.Target != nil {
			qc.Target = &Target{Method: q.Target.Method, URL: q.Target.URL}
		}
		out = append(out, qc)
	}
	return out
}
