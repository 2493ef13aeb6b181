package worker

import (
	"context"
	"time"

	"github.com/sluice-rl/sluice/queue"
)

// Broker is what a Pool needs of the job queue: its consumers (priority levels included), the
// jobs' status records, dead letters, the operators' controls and cancellations, the mover of
// scheduled jobs and the fair queues' layouts. *queue.Queues satisfies it.
type Broker interface {
	jobStore
	// Consumer returns the shared consumer of a queue; queue.ErrUnknownQueue while the queue
	// is not provisioned.
	Consumer(ctx context.Context, name string) (*queue.Consumer, error)
	// Records reads the status records of several jobs in one round trip, those that have
	// one; queue.ErrNoBatchGet where the server cannot.
	Records(ctx context.Context, ids []string) (map[string]queue.Status, error)
	// Controls returns the operators' controls of every queue (pause, rate).
	Controls(ctx context.Context) (map[string]queue.Control, error)
	// WatchControls calls apply with every queue's controls whenever they change, until ctx
	// ends or the watch fails.
	WatchControls(ctx context.Context, apply func(map[string]queue.Control)) error
	// WatchCancels calls fn with the id of every job an operator cancels, until ctx ends or
	// the watch fails.
	WatchCancels(ctx context.Context, fn func(id string)) error
	// Reconnects counts the connection's reconnects to NATS: a change means the server may
	// have restarted and lost recent delivery counts.
	Reconnects() uint64
	// Connected reports whether the connection to NATS is up now.
	Connected() bool
	// WatchLeaders calls fn whenever a consumer elects a new leader, until ctx ends or the
	// watch fails: pull requests waiting at the old leader are gone.
	WatchLeaders(ctx context.Context, fn func()) error
	dueMover    // the scheduled jobs' mover (queue.Schedules)
	levelSource // the priority levels' consumers (queue.Deliveries)
	fairSource  // the fair queues' layouts (queue.Queues.FairLayout)
}

// jobStore is the part of the Broker that carries a plan out (apply): the status records and
// the dead-letter stream. Tests of the executor fake it.
type jobStore interface {
	// Record reads a job's status record; queue.ErrNotFound when it has none.
	Record(ctx context.Context, id string) (queue.Status, error)
	// SetStatus writes a job's status record.
	SetStatus(ctx context.Context, st queue.Status) error
	// ClaimAttempt writes a job's running record of attempt st.Attempts unless its record
	// counts that attempt already (queue.ErrClaimed).
	ClaimAttempt(ctx context.Context, st queue.Status) error
	// DeadLetter moves the job of m to its queue's dead-letter stream and records it failed.
	DeadLetter(ctx context.Context, m *queue.Msg, reason string, lastStatus, attempts int) error
}

// consumer is what a runner needs of its queue's consumer, or of one of its priority levels':
// *queue.Consumer is one. Pool.consumer hands them out.
type consumer interface {
	// Fetch returns up to n jobs available now, or, with wait > 0, the first to arrive within
	// wait; see queue.Consumer.Fetch.
	Fetch(ctx context.Context, n int, wait time.Duration) ([]*queue.Msg, error)
}

// brokerConsumer is a Broker's consumer of queue name's level p.
func brokerConsumer(b Broker) func(ctx context.Context, name string, p queue.Priority) (consumer, error) {
	return func(ctx context.Context, name string, p queue.Priority) (consumer, error) {
		get := b.Consumer
		if p != queue.PriorityNormal {
			get = func(ctx context.Context, name string) (*queue.Consumer, error) { return b.LevelConsumer(ctx, name, p) }
		}
		c, err := get(ctx, name)
		if err != nil {
			return nil, err
		}
		return c, nil
	}
}

// message settles one delivery of a job; *queue.Msg is one. Tests of the executor fake it.
type message interface {
	Ack(ctx context.Context) error
	AckNoWait() error
	Nak(ctx context.Context) error
	NakWithDelay(ctx context.Context, d time.Duration) error
	InProgress(ctx context.Context) error
}

// A Broker has every role the Pool uses, checked here against the queue layer's role types,
// so a signature that drifts fails the build rather than silently stopping scheduled jobs,
// priorities or fair queues.
var (
	_ Broker      = (*queue.Queues)(nil)
	_ message     = (*queue.Msg)(nil)
	_ consumer    = (*queue.Consumer)(nil)
	_ dueMover    = queue.Schedules{}
	_ levelSource = queue.Deliveries{}
	_ jobStore    = (*queue.Queues)(nil)
)
