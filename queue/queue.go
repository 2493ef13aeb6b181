package queue

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
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
	// SharedStreams is how many shared job streams the queues that need nothing beyond a plain
	// job stream ([Shareable]) keep their jobs in (shared.go), 0 to MaxSharedStreams; 0 gives
	// every queue a stream of its own. The zero Options keep that; the processes pass the
	// config's nats.shared_streams, 16 unless the file says otherwise (internal/config).
	SharedStreams int
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
	js  jetstream.JetStream
	pub jetstream.JetStream // for async publishes (see New)
	nc  *nats.Conn
	// api starts js's JetStream API subjects (APIPrefix), for the requests made without
	// nats.go (batched direct gets: readTickets, Records).
	api  string
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
	// consumers are their shared consumers as Provision found or made them, so that a worker
	// starting on many queues asks the server for none of them again.
	consumers map[string]jetstream.Consumer
	// hasBacklog are the queues with a tenants' backlog stream at the last Provision: the fair
	// ones, and those that were fair once and may hold leftovers.
	hasBacklog map[string]bool
	// formerOwn are the shared queues whose own stream (from before they were shared) still
	// exists at the last Provision, until RetireFormer removes it (former.go).
	formerOwn map[string]bool
	// sharedSeen says whether the last Provision found any shared stream (FormersPossible).
	sharedSeen bool
	// formerSeen are the former streams the last scan found; scanning is held by the reader
	// that scans for them (former.go).
	formerSeen atomic.Pointer[formerSnap]
	scanning   sync.Mutex
	// absent are the queues a scan found no job of in a shared stream other than their
	// current one, and when (sharedcount.go, probeFormer); probes counts those reads (tests).
	absent     sync.Map      // absentKey -> time.Time
	probes     atomic.Uint64 // former probes read
	provisions atomic.Uint64 // Provisions so far: an absence found is of the queues then

	backlogs sync.Map // fair queue name -> its backlog stream (jetstream.Stream), for Backlog and Place
	movers   sync.Map // queue name -> the mover consumer of its schedule stream (MoveDue)
	// ledgers are the admission ledgers' streams by name (jetstream.Stream), for releases;
	// ledgersMade the names of those this process made or found as its specs want them
	// (admit makes the others on demand); budgets the deferral budgets' streams made, by name
	// and size (ledger.go).
	ledgers       sync.Map
	ledgersMade   sync.Map
	makingLedgers chan struct{} // held by the ledgers being made on demand (admit)
	budgets       sync.Map
	releases      sync.WaitGroup // background releases of tickets (ledger.go)
	// holdSub drops the hold consumers' deliveries, subscribed by the first consumer this
	// process opens on a connection of its own, holdConn (holdMu; holdDropped: a test's
	// DropHold); holdWait bounds a release by acknowledgement; releaseFallbacks counts those
	// that fell back to deletion (hold.go).
	holdMu           sync.Mutex
	holdSub          *nats.Subscription
	holdConn         *nats.Conn
	holdDropped      bool
	holdWait         time.Duration
	releaser         releaser // gathers the releases by acknowledgement (release.go)
	releaseFallbacks atomic.Uint64
	// schedBytesInFlight is, per queue, the bytes of scheduled jobs being stored now
	// (*atomic.Int64; reserveBytes).
	schedBytesInFlight sync.Map
	// schedules and deadLetters hold the names of the queues whose schedule stream or
	// dead-letter stream this process knows to exist; making is held by the one onDemand
	// making one (ondemand.go).
	schedules   sync.Map
	deadLetters sync.Map
	making      chan struct{}
	// sharedOf maps the shared queues of the last Provision to their shared stream (shared.go);
	// sharedCons holds their durable consumers once looked up or made (jetstream.Consumer).
	sharedOf   atomic.Pointer[map[string]int]
	sharedCons sync.Map
	// sharedStreams are the shared streams' handles by index as text (jetstream.Stream).
	sharedStreams sync.Map
	// pulls is the fetch path's subscription and the fetches waiting on it (pull.go).
	pulls pulls
}

// validName reports whether s is a queue name or key prefix: 1 to 64 of [A-Za-z0-9_-].
func validName(s string) bool { return isToken(s, 64) }

// New returns the queue layer over js and makes sure the status bucket exists. Call
// [Queues.Provision] before publishing or consuming.
func New(ctx context.Context, js jetstream.JetStream, opts Options) (*Queues, error) {
	opts = opts.withDefaults()
	if opts.SharedStreams < 0 || opts.SharedStreams > MaxSharedStreams {
		return nil, fmt.Errorf("queue: SharedStreams %d: want 0 to %d", opts.SharedStreams, MaxSharedStreams)
	}
	if !validName(opts.Prefix) {
		return nil, fmt.Errorf("queue: prefix %q: want 1-64 letters, digits, '-' or '_'", opts.Prefix)
	}
	q := &core{js: js, nc: js.Conn(), api: APIPrefix(js), opts: opts, now: time.Now, specs: map[string]Spec{},
		making: make(chan struct{}, 1), makingLedgers: make(chan struct{}, ledgerMakes), holdWait: defaultHoldWait}
	q.closing, q.stopBackground = context.WithCancel(context.Background())
	q.releaser.q = q
	q.pulls.unsent = q.recordUnsent
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
		err = classify(err)
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

// streamName is the stream of queue's jobs: its own, or its shared stream (shared.go).
func (q *core) streamName(queue string) string {
	if k, ok := q.sharedIndex(queue); ok {
		return q.sharedStreamName(k)
	}
	return q.opts.Prefix + "_Q_" + queue
}

// subject is the root of queue's job subjects: "<prefix>.q.<queue>", or on a shared stream
// "<prefix>.j.<k>.<queue>".
func (q *core) subject(queue string) string {
	if k, ok := q.sharedIndex(queue); ok {
		return q.sharedRoot() + strconv.Itoa(k) + "." + queue
	}
	return q.opts.Prefix + ".q." + queue
}

func (q *core) jobSubject(queue, id string) string { return q.subject(queue) + "." + id }
func (q *core) dlqStreamName(queue string) string  { return q.opts.Prefix + "_DLQ_" + queue }
func (q *core) dlqSubject(queue, id string) string {
	return q.opts.Prefix + ".dlq." + queue + "." + id
}

// spec returns the provisioned spec of queue name.
func (q *core) spec(name string) (Spec, bool) {
	q.mu.RLock()
	defer q.mu.RUnlock()
	s, ok := q.specs[name]
	return s, ok
}

// APIPrefix is the start of js's JetStream API subjects, ending in '.': "$JS.<domain>.API."
// for a context made with a domain (jetstream.NewWithDomain), the prefix given to
// jetstream.NewWithAPIPrefix, else "$JS.API.". A request that nats.go does not build (a
// batched direct get, here and in package fair) must start with it: from a leaf node in a
// JetStream domain of its own, "$JS.API." reaches the leaf's JetStream, not the domain's that
// js names, and in an account that imports another's JetStream under a prefix nothing answers
// it. CheckPermissions probes the subjects under it. It does no I/O.
func APIPrefix(js jetstream.JetStream) string {
	o := js.Options()
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	return jetstream.DefaultAPIPrefix
}

// withDefaultTimeout bounds ctx by d unless it already has a deadline.
func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}
