package queue

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Options configure [New]. The zero value of each field means its default.
type Options struct {
	// StatusTTL is how long a job's status is kept after its last update (job_retention);
	// default 24h.
	StatusTTL time.Duration
	// PublishTimeout bounds Publish when ctx has no deadline; default 2s.
	PublishTimeout time.Duration
	// Prefix starts every stream, subject and bucket name; default "SLUICE".
	Prefix string
	// Replicas is the replica count of the status bucket and dead-letter streams; default 1.
	Replicas int
}

// Queues is the JetStream layer of Sluice. It is safe for concurrent use.
type Queues struct{ js jetstream.JetStream }

// New connects the queue layer to js and creates the status bucket.
func New(ctx context.Context, js jetstream.JetStream, opts Options) (*Queues, error) {
	return &Queues{js: js}, errors.New("queue: not implemented")
}

// Provision creates or updates the streams and consumers of specs.
func (q *Queues) Provision(ctx context.Context, specs []Spec) error { return errors.ErrUnsupported }

// Publish enqueues job and returns after JetStream acknowledged it.
func (q *Queues) Publish(ctx context.Context, job *Job) (Receipt, error) {
	return Receipt{}, errors.ErrUnsupported
}

// Status returns the status of job id, or ErrNotFound.
func (q *Queues) Status(ctx context.Context, id string) (Status, error) {
	return Status{}, errors.ErrUnsupported
}

// SetStatus records st.
func (q *Queues) SetStatus(ctx context.Context, st Status) error { return errors.ErrUnsupported }

// Info describes one queue.
func (q *Queues) Info(ctx context.Context, name string) (Info, error) {
	return Info{}, errors.ErrUnsupported
}

// List describes every provisioned queue.
func (q *Queues) List(ctx context.Context) ([]Info, error) { return nil, errors.ErrUnsupported }

// Consumer is the durable pull consumer of one queue, shared by all workers.
type Consumer struct{}

// Consumer returns the shared consumer of queue name.
func (q *Queues) Consumer(ctx context.Context, name string) (*Consumer, error) {
	return nil, errors.ErrUnsupported
}

// Fetch returns up to max jobs, waiting at most wait.
func (c *Consumer) Fetch(ctx context.Context, max int, wait time.Duration) ([]*Msg, error) {
	return nil, errors.ErrUnsupported
}

// Msg is one delivery of a job.
type Msg struct {
	Job       *Job
	Delivered uint64
}

func (m *Msg) Ack(ctx context.Context) error                           { return errors.ErrUnsupported }
func (m *Msg) InProgress(ctx context.Context) error                    { return errors.ErrUnsupported }
func (m *Msg) NakWithDelay(ctx context.Context, d time.Duration) error { return errors.ErrUnsupported }
func (m *Msg) Nak(ctx context.Context) error                           { return errors.ErrUnsupported }

// DeadLetter moves m to the dead-letter stream.
func (q *Queues) DeadLetter(ctx context.Context, m *Msg, reason string, lastStatus int) error {
	return errors.ErrUnsupported
}

// DeadLetters lists up to limit dead letters of queue.
func (q *Queues) DeadLetters(ctx context.Context, queue string, limit int) ([]DeadLetter, error) {
	return nil, errors.ErrUnsupported
}

// Replay re-publishes dead letter id to its queue.
func (q *Queues) Replay(ctx context.Context, queue string, id string) error {
	return errors.ErrUnsupported
}

// JobID returns the job id for an Idempotency-Key, or a random one when key is "".
func JobID(queue, idempotencyKey string) string { return "" }
