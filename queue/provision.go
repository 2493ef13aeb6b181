package queue

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Provision creates the streams and consumers of specs, or updates them to match, and makes
// them the set of queues this Queues publishes to. It is idempotent and safe to call on every
// config reload: changed limits (MaxDepth, MaxBytes, AckWait, ...) are applied to the existing
// streams without losing jobs. A queue left out of specs is not deleted (its jobs still need
// draining); it only becomes unknown to Publish. The status bucket's TTL is set to
// max(StatusTTL, every DedupeWindow). It returns every problem found, joined: a
// *ProvisionError for each queue that failed (the others are provisioned and known to Publish).
//
// A deadline in ctx bounds the whole call. Without one, each step has its own — the bucket and
// the listing infoWait each, each queue 4*opTimeout from when its turn comes — so that
// thousands of queues on a slow server are not cut off by a bound made for a few.
func (q *Queues) Provision(ctx context.Context, specs []Spec) error {
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

	bctx, cancel := withDefaultTimeout(ctx, infoWait)
	defer cancel()
	if err := q.ensureKeyValue(bctx, q.bucketConfig(ttl)); err != nil {
		errs = append(errs, fmt.Errorf("queue: status bucket %s: %w", q.bucketName(), err))
	}
	// The shared queues and their streams first: every name of a shared queue follows from
	// its stream (shared.go). Their consumers are made by the workers, on demand; those kept
	// are looked up again, so that a changed ack wait reaches them.
	q.planShared(specs)
	q.sharedCons.Clear()
	// A failure is each shared queue's, in its ProvisionError.
	shared, sharedErr := q.provisionShared(bctx, specs)
	// Schedule and dead-letter streams are made on demand; those that exist are kept up to
	// date here.
	lctx, cancel := withDefaultTimeout(ctx, infoWait)
	defer cancel()
	ex, err := q.listExisting(lctx)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("queue: provision: %w", err))...)
	}
	// The queues are provisioned provisionParallel at a time: each is a few round trips to
	// NATS (its streams' and consumer's info, and creations or updates where they differ).
	provisioned, streams, consumers := map[string]Spec{}, map[string]jetstream.Stream{}, map[string]jetstream.Consumer{}
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		sem = make(chan struct{}, provisionParallel)
	)
	// In an order of its own: the processes of a deployment that start together on a fresh
	// server then mostly create different queues and find the others made, instead of all
	// sending the same creations at once (the server serializes them).
	for _, i := range rand.Perm(len(specs)) {
		s := specs[i].withDefaults()
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			qctx, cancel := withDefaultTimeout(ctx, 4*opTimeout)
			defer cancel()
			st, cons, err := q.provision(qctx, s, ex, shared, sharedErr)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, &ProvisionError{Queue: s.Name, Err: err})
				return
			}
			provisioned[s.Name], streams[s.Name] = s, st
			if cons != nil {
				consumers[s.Name] = cons
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	q.mu.Lock()
	for name, s := range provisioned {
		if s.Fair {
			ex.backlogs[name] = true
		}
	}
	q.specs, q.streams, q.consumers, q.hasBacklog = provisioned, streams, consumers, ex.backlogs
	q.provisions.Add(1) // an absence found was of the queues before (sharedcount.go)
	q.formerOwn, q.sharedSeen = map[string]bool{}, ex.shared
	for name := range provisioned {
		if _, shared := q.sharedIndex(name); shared && ex.queues[name] {
			q.formerOwn[name] = true
		}
	}
	q.mu.Unlock()
	return errors.Join(errs...)
}

// ProvisionError is one queue that Provision could not provision; Provision joins one per such
// queue (errors.As finds the first; unwrap the join for all). Err says why, and wraps
// ErrNoCluster or ErrNoStore when that is the cause.
type ProvisionError struct {
	Queue string
	Err   error
}

func (e *ProvisionError) Error() string { return e.Err.Error() }
func (e *ProvisionError) Unwrap() error { return e.Err }

// infoWait bounds Provision's requests for information (the status bucket's, the listing of
// streams) when its ctx has no deadline. nats-server answers those only when no other
// JetStream request waits, so a process that starts while others create thousands of queues
// gets them answered once those creations end (at 10 000 queues, about a minute on 2 busy
// cores): it waits for that rather than fail and start over.
const infoWait = time.Minute

// provisionParallel is how many queues Provision provisions at once.
const provisionParallel = 32

// provision creates or updates the stream and consumer of queue s, without a lookup where ex
// says they are missing; its ledger, schedule and dead-letter streams only where ex says they
// exist.
func (q *core) provision(ctx context.Context, s Spec, ex existing, shared map[int]jetstream.Stream, sharedErr error) (jetstream.Stream, jetstream.Consumer, error) {
	limit := func(n int64) int64 {
		if n == 0 {
			return -1
		}
		return n
	}
	if k, ok := q.sharedIndex(s.Name); ok {
		stream, ok := shared[k]
		if !ok {
			return nil, nil, fmt.Errorf("queue: %q: shared stream %s not provisioned: %w", s.Name, q.sharedStreamName(k), sharedErr)
		}
		return stream, nil, q.provisionParts(ctx, s, ex, limit)
	}
	// Jobs are published to a subject of their own, <prefix>.q.<queue>.<job id>, so that one
	// is found by id; the bare queue subject stays for publishers of earlier versions.
	ensure := q.ensureStream
	if !ex.queues[s.Name] {
		ensure = q.createStream
	}
	stream, err := ensure(ctx, jetstream.StreamConfig{
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
		return nil, nil, fmt.Errorf("queue: %q: stream %s: %w", s.Name, q.streamName(s.Name), err)
	}
	// A stream that holds no consumer (just made, here or by another process) gets it
	// without a lookup first.
	ensureCons := q.ensureConsumer
	if stream.CachedInfo().State.Consumers == 0 {
		ensureCons = q.createConsumer
	}
	cons, err := ensureCons(ctx, q.streamName(s.Name), jetstream.ConsumerConfig{
		Durable:       consumerName,
		Description:   "Sluice workers of queue " + s.Name,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: s.MaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("queue: %q: consumer %s: %w", s.Name, consumerName, err)
	}
	return stream, cons, q.provisionParts(ctx, s, ex, limit)
}

// provisionParts keeps up to date the parts of queue s that exist beside its jobs' stream:
// ledger, dead letters, schedule; and makes a fair queue's backlog and a priority queue's
// levels.
func (q *core) provisionParts(ctx context.Context, s Spec, ex existing, limit func(int64) int64) error {
	// The admission ledger is made by the queue's first job (admit); one that exists is kept
	// up to date here.
	if ex.ledgers[s.Name] {
		if err := q.provisionLedger(ctx, s, limit); err != nil {
			return err
		}
	}
	if ex.deadLetters[s.Name] {
		if err := q.provisionDeadLetters(ctx, s.Name); err != nil {
			return err
		}
	}
	if s.Fair {
		if err := q.provisionBacklog(ctx, s, limit); err != nil {
			return err
		}
	}
	if ex.schedules[s.Name] {
		if err := q.provisionSchedule(ctx, s); err != nil {
			return err
		}
		q.schedules.Store(s.Name, struct{}{})
	}
	if s.Priorities && !s.Fair {
		if err := q.provisionLevels(ctx, s, limit); err != nil {
			return err
		}
	}
	return nil
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
		cname := consumerName
		if q.Shared(name) {
			cname = name
			q.sharedCons.Delete(name)
		}
		err := q.js.DeleteConsumer(ctx, q.streamName(name), cname)
		if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("queue: reset consumer of %q: %w", name, err)
		}
	}
	return nil
}
