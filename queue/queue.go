package queue

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/retry"
)

// Defaults applied where a field of Options or Spec is zero.
const (
	DefaultStatusTTL        = 24 * time.Hour
	DefaultPublishTimeout   = 2 * time.Second
	DefaultPrefix           = "SLUICE"
	DefaultDeadLetterMaxAge = 30 * 24 * time.Hour
	DefaultDedupeWindow     = 24 * time.Hour
	DefaultStreamDuplicates = 2 * time.Minute
	DefaultAckWait          = 30 * time.Second
	DefaultMaxAckPending    = 1000

	// opTimeout bounds calls other than Publish when ctx has no deadline.
	opTimeout = 5 * time.Second
	// asyncAckTimeout is when an async publish's future gives up on its PubAck.
	asyncAckTimeout = 30 * time.Second
	// consumerName is the durable consumer every worker of a queue shares.
	consumerName = "workers"
)

// Options configure [New]. The zero value of each field means its default.
type Options struct {
	// StatusTTL is how long a job's status is kept after its last update (the config's
	// job_retention); default 24h. Entries live at least as long as the longest
	// Spec.DedupeWindow, since they are the idempotency record.
	StatusTTL time.Duration
	// PublishTimeout bounds Publish and Replay when ctx has no deadline; default 2s.
	PublishTimeout time.Duration
	// Prefix starts every stream, subject and bucket name ("SLUICE_Q_orders"); letters, digits,
	// '-' and '_'; default "SLUICE". Tests set a unique one.
	Prefix string
	// Replicas is the replica count of the status bucket and of the dead-letter streams;
	// default 1.
	Replicas int
	// DeadLetterMaxAge is how long a dead letter is kept; default 30 days.
	DeadLetterMaxAge time.Duration
	// IDSecret keys the ids of jobs with an Idempotency-Key (see [IDs.JobID]); at least 16
	// bytes. Nil: New reads the deployment's secret from the "<Prefix>_META" key-value bucket,
	// where the first process to start stores 32 random bytes, so every process agrees.
	IDSecret []byte
}

func (o Options) withDefaults() Options {
	if o.StatusTTL <= 0 {
		o.StatusTTL = DefaultStatusTTL
	}
	if o.PublishTimeout <= 0 {
		o.PublishTimeout = DefaultPublishTimeout
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	if o.DeadLetterMaxAge <= 0 {
		o.DeadLetterMaxAge = DefaultDeadLetterMaxAge
	}
	return o
}

func (s Spec) withDefaults() Spec {
	if s.DedupeWindow <= 0 {
		s.DedupeWindow = DefaultDedupeWindow
	}
	if s.StreamDuplicates <= 0 {
		s.StreamDuplicates = DefaultStreamDuplicates
	}
	if s.Replicas <= 0 {
		s.Replicas = 1
	}
	if s.AckWait <= 0 {
		s.AckWait = DefaultAckWait
	}
	if s.MaxAckPending <= 0 {
		s.MaxAckPending = DefaultMaxAckPending
	}
	return s
}

// Queues is the JetStream layer of Sluice over one connection: it provisions queues and reads
// their state, and hands out its roles, each embedded so that a Queues has their methods too:
//
//   - [Publisher]: publish jobs, read and write their status;
//   - [Deliveries]: hand jobs to workers, dead-letter those that failed for good;
//   - [Operator]: the operators' controls (pause, rate) and cancellations;
//   - [Schedules]: move scheduled jobs into their queues when due;
//   - [IDs]: the id scheme, keyed with the deployment's secret.
//
// The roles share the connection, the provisioned specs and the background work: Publish
// withdraws failed publishes and MoveDue moves due jobs in goroutines of their own, which
// Close ends, and a goroutine follows the connection's status until Close. Make it with New.
// It is safe for concurrent use; many processes may use the same streams at once.
type Queues struct {
	*core
	Publisher
	Deliveries
	Operator
	Schedules
	IDs
}

// core is the state the roles of a Queues share.
type core struct {
	js   jetstream.JetStream
	pub  jetstream.JetStream // for async publishes (see New)
	nc   *nats.Conn
	opts Options
	kv   jetstream.KeyValue
	// noBatchGet: the server answered a batched read (Records) that it cannot serve one.
	noBatchGet atomic.Bool
	now        func() time.Time
	ids        IDs
	meta       jetstream.KeyValue // the meta bucket: id secret, operator controls

	retracts sync.WaitGroup // background withdrawals of failed publishes (retract)
	moves    sync.WaitGroup // background moves of due scheduled jobs (MoveDue)
	// closing ends when Close gives up waiting for them, to stop them.
	closing        context.Context
	stopBackground context.CancelFunc
	conn           connWatch // cancels the operations in flight when the connection is lost

	mu      sync.RWMutex
	specs   map[string]Spec             // provisioned queues, defaults applied
	streams map[string]jetstream.Stream // their streams, for reading jobs by subject

	backlogs sync.Map // fair queue name -> its backlog stream (jetstream.Stream), for Backlog and Place
	movers   sync.Map // queue name -> the mover consumer of its schedule stream (MoveDue)
	// schedules and deadLetters hold the names of the queues whose schedule stream or
	// dead-letter stream this process knows to exist; making is held by the one onDemand
	// making one (ondemand.go).
	schedules   sync.Map
	deadLetters sync.Map
	making      chan struct{}
}

// validName reports whether s is a queue name or key prefix: 1 to 64 of [A-Za-z0-9_-].
func validName(s string) bool { return isToken(s, 64) }

// New returns the queue layer over js and makes sure the status bucket exists. Call
// [Queues.Provision] before publishing or consuming.
func New(ctx context.Context, js jetstream.JetStream, opts Options) (*Queues, error) {
	opts = opts.withDefaults()
	if !validName(opts.Prefix) {
		return nil, fmt.Errorf("queue: prefix %q: want 1-64 letters, digits, '-' or '_'", opts.Prefix)
	}
	q := &core{js: js, nc: js.Conn(), opts: opts, now: time.Now, specs: map[string]Spec{},
		making: make(chan struct{}, 1)}
	q.closing, q.stopBackground = context.WithCancel(context.Background())
	// A JetStream context of our own for async publishes, the same API prefix or domain as js,
	// whose ack timeout frees the futures of acks that never come (callers stop waiting at
	// their ctx deadline; on a reconnect nats.go fails pending futures anyway).
	var err error
	jo := js.Options()
	pubOpts := []jetstream.JetStreamOpt{jetstream.WithPublishAsyncTimeout(asyncAckTimeout)}
	switch {
	case jo.Domain != "":
		q.pub, err = jetstream.NewWithDomain(q.nc, jo.Domain, pubOpts...)
	case jo.APIPrefix != "":
		q.pub, err = jetstream.NewWithAPIPrefix(q.nc, jo.APIPrefix, pubOpts...)
	default:
		q.pub, err = jetstream.New(q.nc, pubOpts...)
	}
	if err != nil {
		return nil, fmt.Errorf("queue: %w", err)
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	kv, err := js.KeyValue(ctx, q.bucketName())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, q.bucketConfig(opts.StatusTTL))
		if errors.Is(err, jetstream.ErrBucketExists) { // another process won the race
			kv, err = js.KeyValue(ctx, q.bucketName())
		}
	}
	if err != nil {
		return nil, fmt.Errorf("queue: status bucket %s: %w", q.bucketName(), err)
	}
	q.kv = kv
	if opts.IDSecret != nil && len(opts.IDSecret) < 16 {
		return nil, errors.New("queue: IDSecret: want at least 16 bytes")
	}
	if q.meta, err = q.openMeta(ctx); err != nil {
		return nil, err
	}
	if q.ids.secret = opts.IDSecret; q.ids.secret == nil {
		if q.ids.secret, err = q.sharedSecret(ctx); err != nil {
			return nil, err
		}
	}
	q.conn.watch(q.nc)
	return &Queues{core: q, Publisher: Publisher{q}, Deliveries: Deliveries{q}, Operator: Operator{q},
		Schedules: Schedules{q}, IDs: q.ids}, nil
}

// ResetConsumers deletes the shared consumer of each named queue that exists, so that the next
// Provision creates it afresh: every job not yet acked is then delivered again at once, in
// stream order, with delivery counts starting over. JetStream keeps a handed-back (nak'd) job
// pending in a consumer's stored state across a server restart, to be redelivered only when
// its AckWait runs out; this is how a deployment with a single consumer process — the
// one-process quickstart, at its start, before any worker runs — gets such jobs back at once.
// With other workers running it would redeliver the jobs they hold.
func (q *Queues) ResetConsumers(ctx context.Context, names []string) error {
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	for _, name := range names {
		err := q.js.DeleteConsumer(ctx, q.streamName(name), consumerName)
		if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("queue: reset consumer of %q: %w", name, err)
		}
	}
	return nil
}

// idSecretKey is the key of the id secret in the meta bucket.
const idSecretKey = "id-secret"

// openMeta opens the meta bucket — deployment settings that outlive jobs: the id secret and
// the queues' operator controls — creating it if it does not exist yet.
func (q *core) openMeta(ctx context.Context) (jetstream.KeyValue, error) {
	name := q.metaBucketName()
	kv, err := q.js.KeyValue(ctx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = q.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: name, Description: "Sluice deployment settings", History: 1,
			Storage: jetstream.FileStorage, Replicas: q.opts.Replicas,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = q.js.KeyValue(ctx, name)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("queue: meta bucket %s: %w", name, err)
	}
	return kv, nil
}

// sharedSecret returns the deployment's id secret from the meta bucket (no TTL, unlike the
// status bucket), storing a random one if there is none yet. Processes that race to store it
// agree on the first one stored (Create fails for the others).
//
// A bucket made a moment ago on a cluster has no stream leader yet, and its reads and writes
// no responders: those are tried again, for at most 10s (leaderPolicy).
func (q *core) sharedSecret(ctx context.Context) ([]byte, error) {
	kv := q.meta
	b := leaderPolicy.Backoff(nil)
	for tries := 0; tries < 3; {
		e, err := kv.Get(ctx, idSecretKey)
		if err == nil && len(e.Value()) >= 16 {
			return e.Value(), nil
		}
		if noLeaderYet(err) && b.Wait(ctx, 0) == nil {
			continue
		}
		if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, fmt.Errorf("queue: read id secret: %w", err)
		}
		secret := make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			return nil, fmt.Errorf("queue: make id secret: %w", err)
		}
		_, err = kv.Create(ctx, idSecretKey, secret)
		switch {
		case err == nil:
			return secret, nil
		case noLeaderYet(err) && b.Wait(ctx, 0) == nil:
		case !errors.Is(err, jetstream.ErrKeyExists):
			return nil, fmt.Errorf("queue: store id secret: %w", err)
		default:
			tries++
		}
	}
	return nil, errors.New("queue: id secret: could not read or store it")
}

// leaderPolicy spaces sharedSecret's tries while a new bucket's stream elects its leader:
// 20ms doubling to 1s, for at most 10s.
var leaderPolicy = retry.Policy{Initial: 20 * time.Millisecond, Max: time.Second, Jitter: -1, MaxElapsed: 10 * time.Second}

// noLeaderYet reports whether err is what a stream without a leader answers: no responders.
func noLeaderYet(err error) bool {
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse)
}

func (q *core) bucketName() string { return q.opts.Prefix + "_STATUS" }

func (q *core) bucketConfig(ttl time.Duration) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      q.bucketName(),
		Description: "Sluice job status, one entry per job id",
		History:     1,
		TTL:         ttl,
		Storage:     jetstream.FileStorage,
		Replicas:    q.opts.Replicas,
	}
}

func (q *core) streamName(queue string) string     { return q.opts.Prefix + "_Q_" + queue }
func (q *core) subject(queue string) string        { return q.opts.Prefix + ".q." + queue }
func (q *core) jobSubject(queue, id string) string { return q.opts.Prefix + ".q." + queue + "." + id }
func (q *core) dlqStreamName(queue string) string  { return q.opts.Prefix + "_DLQ_" + queue }
func (q *core) dlqSubject(queue, id string) string {
	return q.opts.Prefix + ".dlq." + queue + "." + id
}

// Provision creates the streams and consumers of specs, or updates them to match, and makes
// them the set of queues this Queues publishes to. It is idempotent and safe to call on every
// config reload: changed limits (MaxDepth, MaxBytes, AckWait, ...) are applied to the existing
// streams without losing jobs. A queue left out of specs is not deleted (its jobs still need
// draining); it only becomes unknown to Publish. The status bucket's TTL is set to
// max(StatusTTL, every DedupeWindow). It returns every problem found, joined.
func (q *Queues) Provision(ctx context.Context, specs []Spec) error {
	ctx, cancel := withDefaultTimeout(ctx, 4*opTimeout)
	defer cancel()
	var errs []error
	seen := map[string]bool{}
	ttl := q.opts.StatusTTL
	for i, s := range specs {
		if !validName(s.Name) {
			errs = append(errs, fmt.Errorf("queue: specs[%d] %q: name: want 1-64 letters, digits, '-' or '_'", i, s.Name))
			continue
		}
		if seen[s.Name] {
			errs = append(errs, fmt.Errorf("queue: specs[%d] %q: duplicate name", i, s.Name))
			continue
		}
		seen[s.Name] = true
		if s.MaxDepth < 0 || s.MaxBytes < 0 || s.MaxBodyBytes < 0 {
			errs = append(errs, fmt.Errorf("queue: specs[%d] %q: limits must not be negative", i, s.Name))
			continue
		}
		ttl = max(ttl, s.withDefaults().DedupeWindow)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}

	if err := q.ensureKeyValue(ctx, q.bucketConfig(ttl)); err != nil {
		errs = append(errs, fmt.Errorf("queue: status bucket %s: %w", q.bucketName(), err))
	}
	// Schedule and dead-letter streams are made on demand; those that exist are kept up to
	// date here.
	ex, err := q.listExisting(ctx)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("queue: provision: %w", err))...)
	}
	// The queues are provisioned provisionParallel at a time: each is a few round trips to
	// NATS (its streams' and consumer's info, and creations or updates where they differ).
	provisioned, streams := map[string]Spec{}, map[string]jetstream.Stream{}
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		sem = make(chan struct{}, provisionParallel)
	)
	for _, s := range specs {
		s = s.withDefaults()
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			st, err := q.provision(ctx, s, ex)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			provisioned[s.Name], streams[s.Name] = s, st
		}()
	}
	wg.Wait()
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	q.mu.Lock()
	q.specs, q.streams = provisioned, streams
	q.mu.Unlock()
	return errors.Join(errs...)
}

// provisionParallel is how many queues Provision provisions at once.
const provisionParallel = 32

// provision creates or updates the streams and consumers of queue s; its schedule and
// dead-letter streams only where ex says they exist.
func (q *core) provision(ctx context.Context, s Spec, ex existing) (jetstream.Stream, error) {
	limit := func(n int64) int64 {
		if n == 0 {
			return -1
		}
		return n
	}
	// Jobs are published to a subject of their own, <prefix>.q.<queue>.<job id>, so that one
	// is found by id; the bare queue subject stays for publishers of earlier versions.
	stream, err := q.ensureStream(ctx, jetstream.StreamConfig{
		Name:        q.streamName(s.Name),
		Description: "Sluice queue " + s.Name,
		Subjects:    []string{q.subject(s.Name), q.jobSubject(s.Name, "*")},
		Retention:   jetstream.WorkQueuePolicy,
		Discard:     jetstream.DiscardNew,
		MaxMsgs:     limit(s.MaxDepth),
		MaxBytes:    limit(s.MaxBytes),
		Storage:     jetstream.FileStorage,
		Replicas:    s.Replicas,
		Duplicates:  s.StreamDuplicates,
	})
	if err != nil {
		return nil, fmt.Errorf("queue: %q: stream %s: %w", s.Name, q.streamName(s.Name), err)
	}
	err = q.ensureConsumer(ctx, q.streamName(s.Name), jetstream.ConsumerConfig{
		Durable:       consumerName,
		Description:   "Sluice workers of queue " + s.Name,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: s.MaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("queue: %q: consumer %s: %w", s.Name, consumerName, err)
	}
	if ex.deadLetters[s.Name] {
		if err := q.provisionDeadLetters(ctx, s.Name); err != nil {
			return nil, err
		}
	}
	if s.Fair {
		if err := q.provisionBacklog(ctx, s, limit); err != nil {
			return nil, err
		}
	}
	if ex.schedules[s.Name] {
		if err := q.provisionSchedule(ctx, s); err != nil {
			return nil, err
		}
		q.schedules.Store(s.Name, struct{}{})
	}
	if s.Priorities && !s.Fair {
		if err := q.provisionLevels(ctx, s, limit); err != nil {
			return nil, err
		}
	}
	return stream, nil
}

// spec returns the provisioned spec of queue name.
func (q *core) spec(name string) (Spec, bool) {
	q.mu.RLock()
	defer q.mu.RUnlock()
	s, ok := q.specs[name]
	return s, ok
}

// Info describes queue name. It returns ErrUnknownQueue when name is not provisioned.
func (q *Queues) Info(ctx context.Context, name string) (Info, error) {
	s, ok := q.spec(name)
	if !ok {
		return Info{}, fmt.Errorf("%w: %q", ErrUnknownQueue, name)
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	info := Info{Name: name, MaxDepth: s.MaxDepth}
	if s.Fair {
		// The backlogs before the delivery stream: a job the scheduler moves in between is
		// counted twice (at most the scheduler's target of them), never missed.
		if err := q.fairInfo(ctx, name, &info); err != nil {
			return Info{}, err
		}
	}
	st, err := q.js.Stream(ctx, q.streamName(name))
	if err != nil {
		return Info{}, fmt.Errorf("queue: info %q: %w", name, err)
	}
	si, err := st.Info(ctx)
	if err != nil {
		return Info{}, fmt.Errorf("queue: info %q: %w", name, err)
	}
	info.Depth, info.Bytes, info.Consumers = info.Depth+si.State.Msgs, si.State.Bytes, si.State.Consumers
	if si.State.LastSeq >= si.State.Msgs {
		info.Left = si.State.LastSeq - si.State.Msgs
	}
	c, err := st.Consumer(ctx, consumerName)
	if err != nil {
		return Info{}, fmt.Errorf("queue: info %q: consumer: %w", name, err)
	}
	ci, err := c.Info(ctx)
	if err != nil {
		return Info{}, fmt.Errorf("queue: info %q: consumer: %w", name, err)
	}
	info.Pending, info.InFlight = ci.NumPending, ci.NumAckPending
	info.Redelivered, info.Waiting = ci.NumRedelivered, ci.NumWaiting
	if info.DeadLetters, err = q.deadLetterCount(ctx, name); err != nil {
		return Info{}, fmt.Errorf("queue: info %q: dead letters: %w", name, err)
	}
	if info.Scheduled, err = q.scheduled(ctx, name); err != nil {
		return Info{}, fmt.Errorf("queue: info %q: scheduled: %w", name, err)
	}
	if s.Priorities && !s.Fair {
		levels, err := q.levelDepths(ctx, name)
		if err != nil {
			return Info{}, fmt.Errorf("queue: info %q: priorities: %w", name, err)
		}
		info.Depth += levels
	}
	return info, nil
}

// List describes every provisioned queue, sorted by name.
func (q *Queues) List(ctx context.Context) ([]Info, error) {
	q.mu.RLock()
	names := make([]string, 0, len(q.specs))
	for n := range q.specs {
		names = append(names, n)
	}
	q.mu.RUnlock()
	slices.Sort(names)
	out := make([]Info, 0, len(names))
	for _, n := range names {
		info, err := q.Info(ctx, n)
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	return out, nil
}

// withDefaultTimeout bounds ctx by d unless it already has a deadline.
func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}
