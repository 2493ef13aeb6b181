package worker

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/sluice-rl/sluice/internal/cost"
	"github.com/sluice-rl/sluice/internal/tracing"
	"github.com/sluice-rl/sluice/queue"
	"github.com/sluice-rl/sluice/retry"
)

// A policy is one per-queue feature of a runner: the leak slot, concurrency places, the unit
// budget, a tenant's or an operator's pause, the learned rates, the scheduled-job mover, the
// fair scheduler. Each is one value in one file with up to three hooks, each an interface of
// its own below; the runner holds them in a list (policies) and knows none by name.
//
// To add one: write a type with the hooks it needs, test it on its own (a fake clock, a *job,
// no NATS or Redis), and add it to the list in newRunner at its place in the admission order.
// docs/design/worker.md says more.

// admitter decides before a delivery whether job j may go now. admit may wait (for a slot, a
// place, a pause to end) while ctx lasts; it returns go, hold or refuse (verdict). The
// admitters run in the list's order, and each later one's wait is spent holding what the
// earlier ones gave (places), so what holds something comes as late as it can.
type admitter interface {
	admit(ctx context.Context, cfg *QueueConfig, j *job) verdict
}

// observer hears the answer of each delivery: learners, the reconciliation of a cost.
type observer interface {
	observe(cfg *QueueConfig, j *job, a answer)
}

// looper runs in the background for as long as its queue's runner runs (ctx), whatever the
// config; a feature the config turns off waits for a change (queueEnv.until) rather than
// ticking.
type looper interface {
	run(ctx context.Context)
}

// answer is what a delivery brought back, for the observers.
type answer struct {
	resp *http.Response // nil when no answer came
	body []byte         // the body, when the queue keeps it (readsCostBody)
	// stream read a streamed answer's usage events (readCostBody); nil when not streamed, or
	// cut short, which leaves the charge standing.
	stream *cost.Stream
	class  retry.Class
}

// verdict is an admitter's decision on one job.
type verdict struct {
	kind verdictKind
	// until is when a held job may be tried again; reason says why it is held or refused.
	until  time.Time
	reason string
	// end is how the pass ends when the job is refused.
	end passEnd
	// release gives back what a go holds for the delivery (places); nil when it holds nothing.
	release func()
	// valid reports, once every admitter said go, whether what this one holds is still good
	// after the later ones' waits; false sends the job through admission again, after every
	// release. Nil: always.
	valid func() bool
}

type verdictKind uint8

const (
	admitGo verdictKind = iota
	admitHold
	admitRefuse
)

// pass is the verdict that lets a job go, holding nothing.
func pass() verdict { return verdict{} }

// holdUntil is the verdict that keeps a job back until t, unsent: it is handed back to come
// again then, spending no attempt.
func holdUntil(t time.Time, reason string) verdict {
	return verdict{kind: admitHold, until: t, reason: reason}
}

// refuse is the verdict that ends the pass before sending, as end says.
func refuse(end passEnd, reason string) verdict {
	return verdict{kind: admitRefuse, end: end, reason: reason}
}

// policies are a runner's policies, sorted by the hooks they have; admit keeps the list's
// order.
type policies struct {
	// tr traces each run of admission (trace.go); nil: off.
	tr      *tracing.Tracer
	all     []any
	admit   []admitter
	observe []observer
	loops   []looper
}

// newPolicies sorts list by hooks; a value may have any of them.
func newPolicies(list ...any) policies {
	ps := policies{all: list}
	for _, p := range list {
		if a, ok := p.(admitter); ok {
			ps.admit = append(ps.admit, a)
		}
		if o, ok := p.(observer); ok {
			ps.observe = append(ps.observe, o)
		}
		if l, ok := p.(looper); ok {
			ps.loops = append(ps.loops, l)
		}
	}
	return ps
}

// admission runs j through the admitters. It returns the releases of what they hold for the
// delivery, to call (release) once it has ended, or, when one held or refused the job, how
// the pass ends instead (stop), with everything given back. With tracing on, the run is a
// span, with an event for each admitter's verdict.
func (ps *policies) admission(ctx context.Context, cfg *QueueConfig, j *job, now func() time.Time) (releases []func(), out outcome, stop bool) {
	var at admissionTrace
	if ps.tr.On() {
		ctx = at.start(ctx, ps.tr, j)
		defer func() { at.end(out, stop) }()
	}
	for {
		var checks []func() bool
		for _, a := range ps.admit {
			v := a.admit(ctx, cfg, j)
			if at.span != nil {
				at.admitted(a, v)
			}
			switch v.kind {
			case admitHold:
				release(releases)
				return nil, outcome{end: endHold, wait: max(v.until.Sub(now()), 0)}, true
			case admitRefuse:
				release(releases)
				return nil, outcome{end: v.end}, true
			}
			if v.release != nil {
				releases = append(releases, v.release)
			}
			if v.valid != nil {
				checks = append(checks, v.valid)
			}
		}
		if allValid(checks) {
			return releases, outcome{}, false
		}
		// What an earlier admitter holds went stale while a later one waited: all again.
		release(releases)
		releases = nil
	}
}

func allValid(checks []func() bool) bool {
	for _, ok := range checks {
		if !ok() {
			return false
		}
	}
	return true
}

// release calls the releases admission returned, the last admitter's first.
func release(releases []func()) {
	for i := len(releases) - 1; i >= 0; i-- {
		releases[i]()
	}
}

// tenantPauseHearer is a policy that hears at once of the tenants this process paused
// (Pool.tenantsPaused), rather than at its next read.
type tenantPauseHearer interface {
	tenantsPaused(now time.Time, paused map[string]time.Duration)
}

// controlsFollower is a policy that hears at once that the operators' controls changed.
type controlsFollower interface {
	controlsChanged()
}

// queueEnv is what a runner shares with its policies: its queue's name and current config,
// the clock, the log and metrics, and the operators' control of the queue. Policies take it,
// not the runner, so that each is built and tested on its own.
type queueEnv struct {
	name    string
	cfg     func() *QueueConfig
	now     func() time.Time
	log     *slog.Logger
	m       *metrics
	control func() queue.Control
	// until waits until the config changes or ctx ends, and reports whether ctx lasts.
	until func(ctx context.Context) bool
}

// logger returns a logger that names j's queue, id and delivery count.
func (e queueEnv) logger(j *job) *slog.Logger { return jobLogger(e.log, j) }

// jobLogger returns log naming j's queue, id and delivery count. It is made on each call
// rather than kept with the job: most jobs log nothing, and slog's With allocates.
func jobLogger(log *slog.Logger, j *job) *slog.Logger {
	return log.With("queue", j.queue, "job", j.m.Job.ID, "delivered", j.m.Delivered)
}

// every runs fn every period for as long as ctx lasts and on holds for the current config,
// fn first; while on does not hold, it calls off (when not nil) once and waits for the config
// to change instead of ticking, so a feature the queue does not use costs no wake-ups.
func (e queueEnv) every(ctx context.Context, period time.Duration, on func(*QueueConfig) bool, off, fn func(ctx context.Context)) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		if !on(e.cfg()) {
			if off != nil {
				off(ctx)
			}
			if !e.until(ctx) {
				return
			}
			continue
		}
		fn(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
