package regions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Bucket is the JetStream key-value bucket on the coordinator's NATS that holds one Record per
// global queue, keyed by the queue's name.
const Bucket = "sluice_regions"

// casTries bounds the compare-and-set tries of one renewal: each retry means another writer
// renewed in between. Retries wait a random few milliseconds, growing, so that writers that
// collided spread out.
const casTries = 16

// Coordinator renews one holder's leases on the coordinator's bucket: a holder is one process
// of the region (a worker pool, an ingress), named by a random id drawn here. Every holder of
// the region renews: writes are compare-and-set on the revision read, so concurrent renewals
// never lose one another. It is safe for concurrent use.
type Coordinator struct {
	js     jetstream.JetStream
	region string
	id     string // the holder's id in the records (Lease.Holders)
	now    func() time.Time
	home   string // the cluster the bucket is placed in when this coordinator makes it; "": the server's

	mu      sync.Mutex
	kv      jetstream.KeyValue // the bucket as last found; nil: none yet
	demands map[string]float64 // by key, the demand of the holder's last renewal, for Watch
	seen    map[string]seen    // by key, the latest record the holder saw

	writes, conflicts atomic.Int64 // renewals' writes tried, and those that lost a race
}

// Writes reports the renewals' writes this holder tried, and how many of them lost to another
// writer's (a compare-and-set conflict, retried): the cost of renewals on change.
func (c *Coordinator) Writes() (tried, conflicts int64) { return c.writes.Load(), c.conflicts.Load() }

// NewCoordinator returns the coordinator of one holder of region over js, a JetStream context
// on the coordinator's NATS; now is the clock (nil: time.Now). The bucket is made at the first
// renewal, and again if the coordinator lost it.
func NewCoordinator(js jetstream.JetStream, region string, now func() time.Time) *Coordinator {
	if now == nil {
		now = time.Now
	}
	id := strconv.FormatUint(rand.Uint64(), 36)
	return &Coordinator{js: js, region: region, id: id, now: now, demands: map[string]float64{}, seen: map[string]seen{}}
}

// ID is the holder's id in the records: random, drawn when the coordinator was made.
func (c *Coordinator) ID() string { return c.id }

// Home places the bucket, when this coordinator makes it, in the NATS cluster named home: in
// a supercluster (regional clusters joined by gateways) the home region's cluster, wherever
// the renewing process connects. Without it JetStream places a new stream in the cluster of
// the server the request came in on, so the first region to renew would own the bucket. A
// bucket that exists stays where it is. It returns c.
func (c *Coordinator) Home(cluster string) *Coordinator { c.home = cluster; return c }

// Renew renews the holder's lease of queue's global budget with the region's demand
// (deliveries per second) under the terms t, and returns the lease and the record it was
// written in. Before each write it calls lower (when not nil) with the share the write gives
// the holder: a holder applies it at once if it is lower than the share it uses, so that once
// the write lands only the slots it reserved ahead at the former share are left (Terms.Lingers),
// however long the reply takes. It returns an error when the coordinator cannot be reached or
// the record cannot be written within casTries; the holder then goes on with the lease it
// holds (lowered by lower, if a write may have landed).
func (c *Coordinator) Renew(ctx context.Context, queue string, demand float64, t Terms, lower func(share float64)) (Lease, Record, error) {
	kv, err := c.bucket(ctx, false)
	if err != nil {
		return Lease{}, Record{}, err
	}
	c.mu.Lock()
	c.demands[queue] = demand
	c.mu.Unlock()
	looked := false  // the bucket was looked up again after a failed read or write
	var tried uint64 // the revision of the last write that lost a race
	var lastErr error
	for try := range casTries {
		if try > 0 {
			wait := time.Duration(rand.Int64N(int64(try) * int64(2*time.Millisecond)))
			select {
			case <-ctx.Done():
				return Lease{}, Record{}, ctx.Err()
			case <-time.After(wait):
			}
		}
		lease, next, rev, out, err := c.attempt(ctx, kv, queue, demand, t, lower, tried)
		if out != conflicted {
			lastErr = err
		}
		switch {
		case out == written:
			lease.Raced = try > 0 && tried > 0
			return lease, next, nil
		case out == conflicted:
			c.conflicts.Add(1)
			tried = max(rev, 1)
		case ctx.Err() != nil:
			return Lease{}, Record{}, err
		case out == timedOut:
			// A request lost (a link that just came back, a reply dropped): try again.
		case errors.Is(err, errRecord):
			return Lease{}, Record{}, err
		default:
			// The bucket kept may be gone (the coordinator lost it): forget the record seen,
			// and look the bucket up again, once, for half a renew period at most (a look-up
			// needs the JetStream meta leader, which a supercluster elects again after a
			// heal). Either way try again a tenth of a renew period later: after a heal the
			// gateways learn the bucket's subjects within a second or so, and until then its
			// reads find no responders.
			if !looked {
				looked = true
				c.forget(queue)
				lctx, cancel := context.WithTimeout(ctx, t.Renew/2)
				if found, err := c.bucket(lctx, true); err == nil {
					kv = found
				}
				cancel()
			}
			select {
			case <-ctx.Done():
				return Lease{}, Record{}, err
			case <-time.After(t.Renew / 10):
			}
		}
	}
	if lastErr != nil {
		return Lease{}, Record{}, lastErr
	}
	return Lease{}, Record{}, fmt.Errorf("regions: write %q: %d concurrent renewals in a row", queue, casTries)
}

// errRecord is a record that cannot be decoded.
var errRecord = errors.New("regions: undecodable record")

// seen is a record and its revision as the holder's watch last delivered it, and when.
type seen struct {
	rec Record
	rev uint64
	at  time.Time
}

// saw keeps rec at rev as queue's latest seen, unless a later one was.
func (c *Coordinator) saw(queue string, rec Record, rev uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.seen[queue]; !ok || rev > s.rev {
		c.seen[queue] = seen{rec: rec, rev: rev, at: c.now()}
	}
}

// forget drops queue's latest seen record.
func (c *Coordinator) forget(queue string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.seen, queue)
}

// read returns queue's record and its revision (0: none, a fresh record): the one the holder's
// watch delivered, if it is later than tried (a write on it lost a race) and was delivered
// within a renew period (every holder writes once a period, so a watch that delivered nothing
// for longer is broken or behind), so that a renewal over a gateway costs one round trip (the
// write), not two; else the coordinator's, read.
func (c *Coordinator) read(ctx context.Context, kv jetstream.KeyValue, queue string, t Terms, tried uint64) (Record, uint64, error) {
	c.mu.Lock()
	s, ok := c.seen[queue]
	c.mu.Unlock()
	if ok && s.rev > tried && c.now().Sub(s.at) < t.Renew {
		return s.rec, s.rev, nil
	}
	e, err := kv.Get(ctx, queue)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		// No state: the coordinator is new or lost what it had; wait out the longest lease.
		return Fresh(t, c.now()), 0, nil
	case err != nil:
		return Record{}, 0, fmt.Errorf("regions: read %q: %w", queue, err)
	}
	var rec Record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return Record{}, 0, fmt.Errorf("%w %q: %w", errRecord, queue, err)
	}
	return rec, e.Revision(), nil
}

// outcome is how one attempt of a renewal ended.
type outcome int

const (
	written    outcome = iota
	conflicted         // another writer's write landed first: read again
	timedOut           // no answer within a renew period: try again
	failed             // another error: the bucket may be gone
)

// attempt reads queue's record (or takes the one the watch delivered), applies the rule, calls
// lower and writes the result on the revision read, all within a renew period. It returns the
// lease and record written, the revision it wrote on, and how it ended.
func (c *Coordinator) attempt(ctx context.Context, kv jetstream.KeyValue, queue string, demand float64, t Terms,
	lower func(float64), tried uint64) (Lease, Record, uint64, outcome, error) {
	actx, cancel := context.WithTimeout(ctx, t.Renew)
	defer cancel()
	ended := func(err error) outcome {
		if actx.Err() != nil {
			return timedOut
		}
		return failed
	}
	rec, rev, err := c.read(actx, kv, queue, t, tried)
	if err != nil {
		return Lease{}, Record{}, 0, ended(err), err
	}
	now := c.now()
	next, lease := Renew(rec, c.region, c.id, demand, t, now)
	b, err := json.Marshal(next)
	if err != nil {
		return Lease{}, Record{}, 0, failed, err
	}
	if lower != nil && lease.Expires.After(now) { // not while held: the holder's last lease stands
		lower(lease.Share)
	}
	c.writes.Add(1)
	if rev == 0 {
		_, err = kv.Create(actx, queue, b)
	} else {
		_, err = kv.Update(actx, queue, b, rev)
	}
	switch {
	case err == nil:
		return lease, next, rev, written, nil
	case errors.Is(err, jetstream.ErrKeyExists) || isWrongRevision(err):
		return Lease{}, Record{}, rev, conflicted, err
	}
	return Lease{}, Record{}, rev, ended(err), fmt.Errorf("regions: write %q: %w", queue, err)
}

// isWrongRevision reports whether err is a compare-and-set that lost to another writer.
func isWrongRevision(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// bucket returns the coordinator's bucket, made when missing (in the home cluster, if set).
// The bucket found is kept, so that a renewal costs two round trips to the coordinator (a
// read, a write), not three: across a gateway to another region each is that link's round
// trip. With again it looks the bucket up even so: Renew does once a read on the kept bucket
// failed, in case the coordinator lost it, and makes it again if so. A look-up that fails leaves the bucket
// kept: after a heal the supercluster's JetStream elects a meta leader, which a look-up needs
// (and may wait for until the renewal's deadline) and the bucket's reads and writes do not, so
// the next renewal starts from the bucket kept, not from another look-up.
func (c *Coordinator) bucket(ctx context.Context, again bool) (jetstream.KeyValue, error) {
	c.mu.Lock()
	had := c.kv
	c.mu.Unlock()
	if had != nil && !again {
		return had, nil
	}
	kv, err := c.js.KeyValue(ctx, Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		cfg := jetstream.KeyValueConfig{Bucket: Bucket, History: 1,
			Description: "sluice: regional leases of global budgets"}
		if c.home != "" {
			cfg.Placement = &jetstream.Placement{Cluster: c.home}
		}
		kv, err = c.js.CreateOrUpdateKeyValue(ctx, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("regions: coordinator bucket: %w", err)
	}
	c.mu.Lock()
	c.kv = kv
	c.mu.Unlock()
	return kv, nil
}

// Read returns queue's record as the coordinator holds it over js, and false when it holds
// none (the bucket or the key is missing: no region renewed yet, or the coordinator lost its
// state). It writes nothing; the admin API shows what it returns.
func Read(ctx context.Context, js jetstream.JetStream, queue string) (Record, bool, error) {
	kv, err := js.KeyValue(ctx, Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("regions: coordinator bucket: %w", err)
	}
	e, err := kv.Get(ctx, queue)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("regions: read %q: %w", queue, err)
	}
	var rec Record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return Record{}, false, fmt.Errorf("regions: record %q: %w", queue, err)
	}
	return rec, true, nil
}

// Holds reports the share region's lease counts for at now (0 once expired; a lowered share's
// former value while it lingers), as Renew counts it.
func (r Record) Holds(region string, now time.Time) float64 { return r.Leases[region].held(now) }
