package queue

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Shared streams (Options.SharedStreams > 0). A plain queue — not fair, no priority levels, no
// MaxBytes of its own (Shareable) — keeps its jobs in one of S shared job streams,
// "<prefix>_J_<k>", k a stable hash of its name modulo S, each job on
// "<prefix>.j.<k>.<queue>.<job id>". The stream's subjects are "<prefix>.j.<k>.>": k is in the
// subject because a stream's subjects must not overlap another's, and listing every queue's
// subject in its stream's config would make each new queue a stream update. The streams keep
// work-queue retention: each queue has its own durable consumer (named after the queue,
// filtered on "<prefix>.j.<k>.<queue>.>"), made by the first worker that wants it (Consumer),
// not by Provision: a start makes S streams and no consumer whatever the number of queues.
// A queue's depth is its consumer's pending and unacknowledged jobs, or, while it has no
// consumer yet, the count of its subjects in the stream (Info, on demand) or of its ledger's
// tickets (Waiting, Counts: periodic passes list no stream's subjects, sharedcount.go).
//
// How a worker learns that an idle shared queue has a job without holding a pull on it:
// Doorbell, a core NATS subscription to "<prefix>.b.>", where each shared stream republishes
// the headers of every job it stores (a work-queue stream refuses the headers-only ordered
// consumer docs/design/scale.md first planned: its consumers must acknowledge and must not
// overlap), and Waiting, which finds the queues that hold jobs when no bell rang for them
// (before a worker started, a bell lost with the connection, a job handed back or lost by a
// worker).

// MaxSharedStreams is the largest Options.SharedStreams.
const MaxSharedStreams = 1024

// Shareable reports whether queue s can keep its jobs in a shared stream: it needs nothing
// beyond a plain job stream. A fair queue (its tenants' backlog stream), a queue with
// priority levels (their streams) or with its own MaxBytes (a byte bound is a stream's, and
// the admission ledger counts jobs, not bytes) keeps a stream of its own.
func Shareable(s Spec) bool { return !s.Fair && !s.Priorities && s.MaxBytes == 0 }

// sharedIndex is the shared stream of queue, when it is a shared queue of the last Provision.
func (q *core) sharedIndex(queue string) (int, bool) {
	m := q.sharedOf.Load()
	if m == nil {
		return 0, false
	}
	k, ok := (*m)[queue]
	return k, ok
}

// sharedSlot is the shared stream a queue named name goes to among n: FNV-1a of the name.
func sharedSlot(name string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(name))
	return int(h.Sum32() % uint32(n))
}

func (q *core) sharedStreamName(k int) string { return q.opts.Prefix + "_J_" + strconv.Itoa(k) }
func (q *core) sharedRoot() string            { return q.opts.Prefix + ".j." }
func (q *core) bellRoot() string              { return q.opts.Prefix + ".b." }

// Shared reports whether queue name keeps its jobs in a shared stream.
func (q *Queues) Shared(name string) bool {
	_, ok := q.sharedIndex(name)
	return ok
}

// planShared decides which of specs are shared queues and in which stream, before anything
// is provisioned: every name the queue layer builds for them follows from it.
func (q *core) planShared(specs []Spec) {
	m := map[string]int{}
	if n := q.opts.SharedStreams; n > 0 {
		for _, s := range specs {
			if Shareable(s) {
				m[s.Name] = sharedSlot(s.Name, n)
			}
		}
	}
	q.sharedOf.Store(&m)
}

// provisionShared makes the shared streams that specs' shared queues use (all S when one is
// used), with the longest of their duplicate windows, and returns them by index.
func (q *core) provisionShared(ctx context.Context, specs []Spec) (map[int]jetstream.Stream, error) {
	dup := time.Duration(0)
	replicas := q.opts.Replicas
	used := false
	for _, s := range specs {
		if _, ok := q.sharedIndex(s.Name); ok {
			s = s.withDefaults()
			dup, replicas, used = max(dup, s.StreamDuplicates), max(replicas, s.Replicas), true
		}
	}
	out := map[int]jetstream.Stream{}
	if !used {
		return out, nil
	}
	var errs []error
	for k := range q.opts.SharedStreams {
		st, err := q.ensureStream(ctx, jetstream.StreamConfig{
			Name:        q.sharedStreamName(k),
			Description: "Sluice shared job stream " + strconv.Itoa(k) + " of " + strconv.Itoa(q.opts.SharedStreams),
			Subjects:    []string{q.sharedRoot() + strconv.Itoa(k) + ".>"},
			Retention:   jetstream.WorkQueuePolicy,
			Discard:     jetstream.DiscardNew,
			MaxMsgs:     -1,
			MaxBytes:    -1,
			Storage:     jetstream.FileStorage,
			Replicas:    replicas,
			Duplicates:  dup,
			// The doorbell: every job stored, headers only, on <prefix>.b.<k>.<queue>.<id>.
			RePublish: &jetstream.RePublish{Source: q.sharedRoot() + strconv.Itoa(k) + ".>",
				Destination: q.bellRoot() + strconv.Itoa(k) + ".>", HeadersOnly: true},
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("queue: shared stream %s: %w", q.sharedStreamName(k), err))
			continue
		}
		out[k] = st
		q.sharedStreams.Store(strconv.Itoa(k), st)
	}
	return out, errors.Join(errs...)
}

// sharedStream is shared stream k (its index, as text), looked up once.
func (q *core) sharedStream(ctx context.Context, k string) (jetstream.Stream, error) {
	if st, ok := q.sharedStreams.Load(k); ok {
		return st.(jetstream.Stream), nil
	}
	st, err := q.js.Stream(ctx, q.opts.Prefix+"_J_"+k)
	if err != nil {
		return nil, fmt.Errorf("queue: shared stream %s: %w", k, err)
	}
	q.sharedStreams.Store(k, st)
	return st, nil
}

// sharedConsumerConfig is the durable consumer of shared queue s in its stream.
func (q *core) sharedConsumerConfig(s Spec) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       s.Name,
		Description:   "Sluice workers of queue " + s.Name,
		FilterSubject: q.subject(s.Name) + ".>",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: s.MaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		// A queue idle that long loses its consumer (nats-server deletes it): see
		// SharedInactive.
		InactiveThreshold: SharedInactive,
	}
}

// SharedInactive is how long a shared queue's consumer stays with no worker pulling from it
// before nats-server deletes it: a queue idle that long, or no longer configured, costs the
// server nothing more. No job is lost with it: a job in the shared stream stays there (work-
// queue retention keeps every message until a consumer acknowledges it), the workers' scan
// finds its subject (Waiting) and the consumer is made again, delivering from the first job.
// A runner pulls from its consumer while any of its jobs is waiting or unacknowledged
// (stopIdle), so a consumer is deleted only when no worker ran for SharedInactive, or its
// queue was idle that long; then a job handed back with a delay is delivered again at once.
// A variable for tests.
var SharedInactive = time.Hour

// sharedConsumerTTL is how long a process uses a shared consumer's handle before it looks the
// consumer up again: less than SharedInactive, so that a handle kept is of a consumer that
// was in use (by this process) less than SharedInactive ago, hence not deleted.
func sharedConsumerTTL() time.Duration { return SharedInactive / 2 }

// cachedConsumer is a shared consumer's handle and when it was looked up or made.
type cachedConsumer struct {
	c  jetstream.Consumer
	at time.Time
}

// sharedConsumer returns the durable consumer of shared queue s, making it when it is missing
// (one lookup, and one creation on the queue's first job ever, or after SharedInactive idle),
// and keeps it for the calls of the next sharedConsumerTTL.
func (q *core) sharedConsumer(ctx context.Context, s Spec) (jetstream.Consumer, error) {
	if c, ok := q.sharedCons.Load(s.Name); ok && q.now().Sub(c.(cachedConsumer).at) < sharedConsumerTTL() {
		return c.(cachedConsumer).c, nil
	}
	c, err := q.ensureConsumer(ctx, q.streamName(s.Name), q.sharedConsumerConfig(s.withDefaults()))
	if err != nil {
		return nil, err
	}
	q.sharedCons.Store(s.Name, cachedConsumer{c, q.now()})
	return c, nil
}

// Doorbell calls ring with the name of the queue of every job stored in a shared stream from
// now on (the bell), in the connection's dispatch goroutine: ring must return at once. The
// bells are the shared streams' republished headers (RePublish, HeadersOnly: no body), sent
// once the job is stored; a bell is lost while the connection is down or the subscription
// falls behind, which Waiting makes up for. It returns the subscription's stop.
func (q *Queues) Doorbell(ring func(queue string)) (stop func(), err error) {
	root := q.bellRoot()
	sub, err := q.nc.Subscribe(root+">", func(m *nats.Msg) {
		// <root><k>.<queue>.<id>
		rest, ok := strings.CutPrefix(m.Subject, root)
		if !ok {
			return
		}
		if i := strings.IndexByte(rest, '.'); i >= 0 {
			rest = rest[i+1:]
			if j := strings.IndexByte(rest, '.'); j > 0 {
				ring(rest[:j])
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("queue: doorbell: %w", err)
	}
	// Every job goes by: let a burst queue up rather than drop bells (Waiting finds those).
	_ = sub.SetPendingLimits(1<<20, 256<<20)
	return func() { _ = sub.Unsubscribe() }, nil
}

// Waiting returns the shared queues that hold jobs, waiting or unacknowledged, by depth (in
// their current and former streams), and by queue the former streams that may hold its jobs
// (former.go): one listing of the shared streams, then, of each that holds messages, a
// listing of its consumers and, when they do not account for all of them, one listing of the
// ledgers (the jobs of queues without a consumer yet, by their tickets: sharedcount.go). Its
// cost grows with the shared streams, the consumers of those that hold jobs and the queues
// that ever had a job / 256, not with the jobs held.
func (q *Queues) Waiting(ctx context.Context) (waiting map[string]uint64, formers map[string][]string, err error) {
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	counts, formers, err := q.sharedScan(ctx, false, nil)
	waiting = map[string]uint64{}
	for name, c := range counts {
		if c.Depth > 0 {
			waiting[name] = c.Depth
		}
	}
	return waiting, formers, err
}

// sharedInfo fills in info for shared queue s: from its consumer, or, while it has none, from
// its subjects' count. Bytes is not known per queue of a shared stream: 0.
func (q *core) sharedInfo(ctx context.Context, s Spec, info *Info) error {
	st, ok := q.stream(s.Name)
	if !ok {
		return fmt.Errorf("queue: info %q: no shared stream", s.Name)
	}
	c, err := st.Consumer(ctx, s.Name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		si, err := st.Info(ctx, jetstream.WithSubjectFilter(q.subject(s.Name)+".>"))
		if err != nil {
			return fmt.Errorf("queue: info %q: %w", s.Name, err)
		}
		for _, n := range si.State.Subjects {
			info.Depth += n
		}
		info.Pending = info.Depth
		return nil
	}
	if err != nil {
		return fmt.Errorf("queue: info %q: consumer: %w", s.Name, err)
	}
	ci, err := c.Info(ctx)
	if err != nil {
		return fmt.Errorf("queue: info %q: consumer: %w", s.Name, err)
	}
	info.Pending, info.InFlight = ci.NumPending, ci.NumAckPending
	info.Redelivered, info.Waiting = ci.NumRedelivered, ci.NumWaiting
	info.Depth += ci.NumPending + uint64(ci.NumAckPending)
	info.Consumers = 1
	// Jobs acknowledged: the consumer's ack floor counts deliveries, redeliveries included.
	info.Left = ci.AckFloor.Consumer
	return nil
}

// Idle reports whether the consumer holds no job for anyone: none waiting, none delivered and
// unacknowledged (a job a worker handed back with a delay, or holds now). A runner of a shared
// queue stops only then, since no bell rings for a redelivery.
func (c *Consumer) Idle(ctx context.Context) (bool, error) {
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	ci, err := c.c.Info(ctx)
	if err != nil {
		return false, fmt.Errorf("queue: consumer of %q: %w", c.queue, err)
	}
	return ci.NumPending == 0 && ci.NumAckPending == 0, nil
}

// sharedBacklog is Backlog for shared queue s of stream st. Its consumer's ack floor counts
// in the shared stream's sequences, which every queue of the stream advances: AckFloor is
// instead the stream's last sequence less the queue's jobs, so that a job just stored has the
// queue's jobs ahead of it (an estimate: the eta of a job stored long ago comes out short).
func (q *core) sharedBacklog(ctx context.Context, s Spec, st jetstream.Stream) (Backlog, error) {
	var info Info
	if err := q.sharedInfo(ctx, s, &info); err != nil {
		return Backlog{}, err
	}
	si, err := st.Info(ctx)
	if err != nil {
		return Backlog{}, fmt.Errorf("queue: backlog of %q: %w", s.Name, err)
	}
	out := Backlog{Pending: info.Pending, InFlight: info.InFlight}
	if held := info.Pending + uint64(max(info.InFlight, 0)); si.State.LastSeq > held {
		out.AckFloor = si.State.LastSeq - held
	}
	return out, nil
}
