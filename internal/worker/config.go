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

// DefaultShutdownTimeout bounds a graceful shutdown when Deps.ShutdownTimeout is zero.
const DefaultShutdownTimeout = config.DefaultShutdownTimeout

// QueueConfig is how a worker drains one queue. It is complete: New and Reload validate it and
// apply no defaults — the config file's defaults are applied once, by internal/config, and
// FromConfig carries them here.
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
	// MaxAttempts is how many delivery attempts a job gets before it is dead-lettered, >= 1;
	// an attempt is spent by every delivery except one the upstream answered with 429 or 503.
	MaxAttempts int
	// Backoff spaces the retries of a failed attempt: attempt n is followed by
	// Backoff.Delay(n, rnd). Its MaxAttempts and MaxElapsed are ignored.
	Backoff retry.Policy
	// Timeout bounds one delivery attempt, from sending the request to reading the response
	// headers and draining the body; > 0.
	Timeout time.Duration
	// Concurrency is how many jobs of this queue one Pool holds at once, >= 1: each waits for
	// its leak slot and then is delivered. It bounds both the in-flight deliveries and the
	// messages held unacknowledged.
	Concurrency int
	// MaxPauseRetries is how many times a job is retried after a 429 or 503 without spending
	// an attempt, >= 0; beyond it the job is dead-lettered (0: the first 429 does).
	MaxPauseRetries int
	// DefaultPause is how long the queue pauses after a 429 or 503 without a wait in its
	// headers; > 0.
	DefaultPause time.Duration
	// AckWait is the queue consumer's AckWait, > 0; a job held longer than AckWait/3 (waiting
	// for its slot, or being delivered) is kept alive with InProgress every AckWait/3.
	AckWait time.Duration
	// Global shares Rate with the other regions (Deps.Regions): this region delivers at its
	// lease's share of it, and asks for the same fraction of Units (regions.go). Without
	// Deps.Regions it has no effect.
	Global bool
	// Adaptive makes Rate a ceiling: the workers learn the rate the upstream takes (see
	// adaptive.go), never below MinRate deliveries per second (> 0 when Adaptive).
	Adaptive bool
	MinRate  float64
	// Fair makes the queue share its deliveries among its tenants: the Pool runs the
	// queue's scheduler (package queue/fair, one leader among all processes) and holds few jobs
	// waiting for slots, so that the order the scheduler chose is the order of delivery.
	Fair bool
	// Priorities: the queue has priority levels (queue.Spec.Priorities); its runner takes
	// high jobs before normal before low (priority.go).
	Priorities bool
	// FairByUnits makes a fair queue share its Units among its tenants by weight, each job
	// counted at its Job.Cost, instead of its deliveries (config fair_by: units). Needs Fair
	// and Units.
	FairByUnits bool
	// Weights are the tenants' weights in a fair queue, by tenant (Job.Tenant); default 1.
	Weights map[string]float64
	// TenantRate caps the deliveries per second of one tenant of a fair queue; 0: none.
	TenantRate float64
	// PauseTenant makes an upstream's 429 or 503 pause the job's tenant, on every worker,
	// instead of the whole queue (pause_scope: tenant; tenants.go). Needs Fair.
	PauseTenant bool
	// MaxInFlight caps the queue's deliveries in flight at once across every process (places,
	// inflight.go); 0: none. TenantInFlight does the same per tenant of a fair queue.
	MaxInFlight    int64
	TenantInFlight int64
	// TenantRates and TenantInFlights are single tenants' own caps from the config file, by
	// tenant id, in place of TenantRate and TenantInFlight; an operator's (the queue's control)
	// replace them in turn.
	TenantRates     map[string]float64
	TenantInFlights map[string]int64
	// Units is the queue's unit budget (cost_rate, cost_burst), beside Rate: a job waits for
	// one slot of both, charged its Job.Cost (0 means 1). Zero: none (cost.go).
	Units leaky.Units
	// CostCapacity caps a job's charge (config.Queue.CostCapacity); 0: no cap.
	CostCapacity int64
	// CostFromResponse reads a delivery's true cost from its answer, to reconcile with the
	// charge; the zero Cost reads none.
	CostFromResponse config.Cost
	// Budgets are the queue's named unit budgets (config budgets), in place of Units: a job
	// waits for one slot of Rate and every budget, charged its Job.Costs (budgets.go).
	Budgets []Budget
}

// Target is the destination of a queue's directly submitted jobs.
type Target struct {
	// Method is the HTTP method; "" means POST.
	Method string
	// URL is an absolute http or https URL.
	URL string
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
	if c.Target != nil && c.Target.Method == "" {
		errs = append(errs, errors.New("target method is required"))
	}
	if c.MaxAttempts < 1 {
		errs = append(errs, errors.New("max attempts must be >= 1"))
	}
	if c.Timeout <= 0 || c.DefaultPause <= 0 || c.AckWait <= 0 {
		errs = append(errs, errors.New("timeout, default pause and ack wait must be > 0"))
	}
	if c.Concurrency < 1 {
		errs = append(errs, errors.New("concurrency must be >= 1"))
	}
	if c.MaxPauseRetries < 0 {
		errs = append(errs, errors.New("max pause retries must be >= 0"))
	}
	errs = append(errs, c.validateScheduling()...)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("worker: queue %q: %w", c.Name, err)
	}
	return nil
}

// tenantSettings adds the file's settings of single tenants (by value) to c, by tenant id.
func (c *QueueConfig) tenantSettings(settings map[string]config.TenantSettings, tenantID func(key []byte) string) {
	for v, ts := range settings {
		id := tenantID([]byte(v))
		if ts.Weight > 0 {
			if c.Weights == nil {
				c.Weights = map[string]float64{}
			}
			c.Weights[id] = ts.Weight
		}
		if r := ts.Rate.PerSecond(); r > 0 {
			if c.TenantRates == nil {
				c.TenantRates = map[string]float64{}
			}
			c.TenantRates[id] = r
		}
		if ts.InFlight > 0 {
			if c.TenantInFlights == nil {
				c.TenantInFlights = map[string]int64{}
			}
			c.TenantInFlights[id] = ts.InFlight
		}
	}
}

// validateScheduling reports what makes c's adaptive, tenant and concurrency settings unusable.
func (c QueueConfig) validateScheduling() []error {
	var errs []error
	if (c.PauseTenant || c.TenantInFlight > 0) && !c.Fair {
		errs = append(errs, errors.New("pausing tenants and tenant_in_flight need a fair queue"))
	}
	if c.MaxInFlight < 0 || c.TenantInFlight < 0 {
		errs = append(errs, errors.New("max in flight and tenant in flight must be >= 0"))
	}
	if !c.Units.IsZero() && (c.Units.N <= 0 || c.Units.Per < time.Microsecond || c.Units.Burst < 0) {
		errs = append(errs, fmt.Errorf("unit budget %v must have N > 0, a period of at least 1µs and burst >= 0", c.Units))
	}
	if c.FairByUnits && (!c.Fair || c.Units.IsZero()) {
		errs = append(errs, errors.New("a fair share by units needs a fair queue with a unit budget"))
	}
	if c.Adaptive && !(c.MinRate > 0) {
		errs = append(errs, errors.New("an adaptive queue needs a min rate > 0"))
	}
	return append(errs, c.validateBudgets()...)
}

func absHTTP(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// FromConfig maps the queues of a config file to the worker's per-queue configs: the rate and
// burst to a leak rate, cfg.Upstream to every queue's Upstream, the queue's target, attempts,
// backoff, timeout, concurrency, ack_wait and max_pause_retries, all complete in a loaded config;
// a fair queue's weights by tenant id, tenantID (*queue.Queues.TenantID) of each value.
func FromConfig(cfg *config.Config, tenantID func(key []byte) string) []QueueConfig {
	out := make([]QueueConfig, 0, len(cfg.Queues))
	for _, q := range cfg.Queues {
		qc := QueueConfig{
			Name:            q.Name,
			Rate:            leaky.Rate{Interval: q.Rate.Interval(), Burst: q.Burst},
			Upstream:        strings.TrimSpace(cfg.Upstream),
			MaxAttempts:     q.MaxAttempts,
			Backoff:         retry.Policy{Initial: q.Backoff.Initial, Max: q.Backoff.Max},
			Timeout:         q.Timeout,
			Concurrency:     q.Concurrency,
			AckWait:         q.AckWait,
			MaxPauseRetries: q.MaxPauseRetries,
			DefaultPause:    config.DefaultPause,
			Adaptive:        q.Adaptive,
			Global:          q.Global,
			MinRate:         q.MinRate.PerSecond(),
			Fair:            q.Fair,
			Priorities:      q.Priorities,
			Weights:         q.TenantWeights(tenantID),
			TenantRate:      q.TenantRate.PerSecond(),
			PauseTenant:     q.PauseScope == config.PauseTenant,
			MaxInFlight:     q.MaxInFlight,
			TenantInFlight:  q.TenantInFlight,
		}
		if q.CostRate.N > 0 {
			qc.Units = leaky.Units{N: q.CostRate.N, Per: q.CostRate.Per, Burst: q.CostBurst}
			qc.CostCapacity, qc.CostFromResponse = q.CostCapacity(), q.CostFromResponse
			qc.FairByUnits = q.Fair && q.FairBy == config.FairByUnits
		}
		qc.Budgets = budgetsFromConfig(q.Budgets)
		if q.Target != nil {
			qc.Target = &Target{Method: q.Target.Method, URL: q.Target.URL}
		}
		qc.tenantSettings(q.TenantSettings, tenantID)
		out = append(out, qc)
	}
	return out
}
