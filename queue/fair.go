package queue

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Fair queues. The package doc's "Fair share among tenants" says how they work; this file
// holds the backlog's names, the scheduler ([Fair]) and the tenants' figures.

const (
	// hdrStored carries, on a job moved from its tenant's backlog to the delivery stream, when
	// the job was first stored (Unix nanoseconds): Msg.Timestamp reports that instant, not the
	// move, so the check of late-stored jobs (Job.AckBy) sees the true storage time.
	hdrStored = "Sluice-Stored"

	// leaseRenew is how often the scheduler that leads a fair queue renews its lease;
	// leaseExpire is how long a lease left unrenewed stops the others from taking over.
	leaseRenew  = 500 * time.Millisecond
	leaseExpire = 2 * time.Second
	// refreshEvery is how often the leader rereads which tenants have waiting jobs;
	// refreshIdle, how often while it knows of none.
	refreshEvery = 500 * time.Millisecond
	refreshIdle  = 100 * time.Millisecond
	// pollEvery is how often the leader looks at the delivery stream while it is full enough.
	pollEvery = 20 * time.Millisecond
	// flushEvery is how often the leader writes the tenants' delivered counts.
	flushEvery = time.Second
	// moveParallel bounds the tenants whose jobs one round moves at once.
	moveParallel = 32
	// tenantsTTL is how long a tenant's delivered count is kept after its last change.
	tenantsTTL = 24 * time.Hour
	// TopTenants is how many tenants Info lists by depth.
	TopTenants = 10
)

// validToken reports whether s can be a subject token as it is: 1 to 64 of [A-Za-z0-9_-].
func validToken(s string) bool { return isToken(s, 64) }

// tenantToken is the subject token of tenant: "_" for the queue's one unnamed tenant, the
// tenant itself when it is a short token (the ingress's tenants are hex hashes), else a hash.
func tenantToken(tenant string) string {
	switch {
	case tenant == "":
		return "_"
	case tenant != "_" && validToken(tenant):
		return tenant
	}
	sum := sha256.Sum256([]byte(tenant))
	return hex.EncodeToString(sum[:16])
}

// tokenTenant is the tenant of a subject token, as far as it can be told back.
func tokenTenant(tok string) string {
	if tok == "_" {
		return ""
	}
	return tok
}

func (q *Queues) backlogStreamName(queue string) string { return q.opts.Prefix + "_T_" + queue }
func (q *Queues) backlogSubject(queue, tenant string) string {
	return q.opts.Prefix + ".t." + queue + "." + tenantToken(tenant)
}
func (q *Queues) tenantsBucketName() string { return q.opts.Prefix + "_TENANTS" }

// provisionBacklog creates or updates the backlog stream of fair queue s: one subject per
// tenant, the queue's depth limits, direct gets for the scheduler.
func (q *Queues) provisionBacklog(ctx context.Context, s Spec, limit func(int64) int64) error {
	_, err := q.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        q.backlogStreamName(s.Name),
		Description: "Sluice tenants' backlogs of fair queue " + s.Name,
		Subjects:    []string{q.opts.Prefix + ".t." + s.Name + ".*"},
		Retention:   jetstream.WorkQueuePolicy,
		Discard:     jetstream.DiscardNew,
		MaxMsgs:     limit(s.MaxDepth),
		MaxBytes:    limit(s.MaxBytes),
		Storage:     jetstream.FileStorage,
		Replicas:    s.Replicas,
		Duplicates:  s.StreamDuplicates,
		AllowDirect: true,
	})
	if err != nil {
		return fmt.Errorf("queue: %q: backlog stream %s: %w", s.Name, q.backlogStreamName(s.Name), err)
	}
	_, err = q.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: q.tenantsBucketName(), Description: "Sluice fair queues: jobs delivered per tenant",
		History: 1, TTL: tenantsTTL, Storage: jetstream.FileStorage, Replicas: q.opts.Replicas,
	})
	if err != nil {
		return fmt.Errorf("queue: %q: tenants bucket %s: %w", s.Name, q.tenantsBucketName(), err)
	}
	return nil
}

// TenantDepth is one tenant's waiting jobs in a fair queue.
type TenantDepth struct {
	// Tenant is the tenant (Job.Tenant); "" is the queue's unnamed tenant.
	Tenant string `json:"tenant"`
	// Depth is how many of its jobs wait in its backlog.
	Depth uint64 `json:"depth"`
}

// TenantInfo describes one tenant of a fair queue.
type TenantInfo struct {
	Queue  string `json:"queue"`
	Tenant string `json:"tenant"`
	// Depth is how many of the tenant's jobs wait in its backlog (jobs the scheduler already
	// handed to the workers are not counted).
	Depth uint64 `json:"depth"`
	// Delivered is how many of the tenant's jobs the scheduler has handed to the workers,
	// kept until the tenant has had none for 24 hours.
	Delivered uint64 `json:"delivered"`
}

// backlogs returns the depth of every tenant with waiting jobs in fair queue name.
func (q *Queues) backlogs(ctx context.Context, name string) (map[string]uint64, uint64, error) {
	st, err := q.js.Stream(ctx, q.backlogStreamName(name))
	if err != nil {
		return nil, 0, err
	}
	return q.backlogDepths(ctx, st, name)
}

// backlogDepths is backlogs with the backlog stream st in hand: one request.
func (q *Queues) backlogDepths(ctx context.Context, st jetstream.Stream, name string) (map[string]uint64, uint64, error) {
	si, err := st.Info(ctx, jetstream.WithSubjectFilter(q.opts.Prefix+".t."+name+".*"))
	if err != nil {
		return nil, 0, err
	}
	prefix := q.opts.Prefix + ".t." + name + "."
	out := make(map[string]uint64, len(si.State.Subjects))
	for subj, n := range si.State.Subjects {
		out[tokenTenant(strings.TrimPrefix(subj, prefix))] = n
	}
	return out, si.State.Msgs, nil
}

// fairInfo adds the tenants of fair queue name to info.
func (q *Queues) fairInfo(ctx context.Context, name string, info *Info) error {
	depths, msgs, err := q.backlogs(ctx, name)
	if err != nil {
		return fmt.Errorf("queue: info %q: backlogs: %w", name, err)
	}
	info.Fair, info.Depth, info.Backlog = true, info.Depth+msgs, msgs
	info.Tenants = len(depths)
	top := make([]TenantDepth, 0, len(depths))
	for t, n := range depths {
		top = append(top, TenantDepth{Tenant: t, Depth: n})
	}
	slices.SortFunc(top, func(a, b TenantDepth) int {
		return cmp.Or(cmp.Compare(b.Depth, a.Depth), strings.Compare(a.Tenant, b.Tenant))
	})
	info.TopTenants = top[:min(len(top), TopTenants)]
	return nil
}

// Tenant describes tenant of fair queue name. It returns ErrUnknownQueue when name is not a
// provisioned fair queue.
func (q *Queues) Tenant(ctx context.Context, name, tenant string) (TenantInfo, error) {
	s, ok := q.spec(name)
	if !ok || !s.Fair {
		return TenantInfo{}, fmt.Errorf("%w: %q (not a fair queue)", ErrUnknownQueue, name)
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	out := TenantInfo{Queue: name, Tenant: tenant}
	st, err := q.js.Stream(ctx, q.backlogStreamName(name))
	if err != nil {
		return TenantInfo{}, fmt.Errorf("queue: tenant of %q: %w", name, err)
	}
	subj := q.backlogSubject(name, tenant)
	si, err := st.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		return TenantInfo{}, fmt.Errorf("queue: tenant of %q: %w", name, err)
	}
	out.Depth = si.State.Subjects[subj]
	kv, err := q.js.KeyValue(ctx, q.tenantsBucketName())
	if err != nil {
		return TenantInfo{}, fmt.Errorf("queue: tenant of %q: %w", name, err)
	}
	if e, err := kv.Get(ctx, countKey(name, tenant)); err == nil {
		out.Delivered, _ = strconv.ParseUint(string(e.Value()), 10, 64)
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return TenantInfo{}, fmt.Errorf("queue: tenant of %q: %w", name, err)
	}
	return out, nil
}

func countKey(queue, tenant string) string { return queue + "." + tenantToken(tenant) }

// FairOptions configure the scheduler of a fair queue.
type FairOptions struct {
	// Weights maps a tenant (Job.Tenant) to its weight, > 0; a tenant not in it weighs 1.
	// While tenants have jobs waiting, each gets jobs in proportion to its weight.
	Weights map[string]float64
	// TenantRate caps how many jobs per second one tenant's backlog releases; 0: no cap.
	TenantRate float64
	// Target is how many jobs the scheduler keeps waiting in the delivery stream, ahead of the
	// workers; >= 1. Jobs there are served in order, so Target over the queue's rate is
	// the most a newly arrived tenant waits behind others' jobs. Default 1.
	Target int
	// Logger receives the scheduler's logs (leadership changes, failures). Nil: discarded.
	Logger *slog.Logger
	// Drain makes Run return once the backlogs are empty, or when the queue has none: for a
	// queue that was fair and no longer is, whose tenants' jobs still wait.
	Drain bool
}

// Fair is the scheduler of one fair queue: it moves jobs from the tenants' backlogs to the
// delivery stream, where workers take them as from any queue, in weighted round robin. Any
// number of processes may run one for the same queue; a lease lets one of them work at a
// time. Create it with [Queues.Fair], run it with Run.
type Fair struct {
	q     *Queues
	queue string
	owner string

	mu   sync.Mutex
	opts FairOptions

	// The leader's state, touched only by Run's goroutine.
	ring      []*tenant          // tenants with waiting jobs, in round-robin order
	byID      map[string]*tenant // the ring's tenants by tenant
	pos       int                // the ring's next tenant
	cmu       sync.Mutex         // guards counts, which moves update in parallel
	counts    map[string]*count  // delivered counts, by tenant
	refreshed time.Time
	leaseRev  uint64    // revision of our lease entry while we lead
	seenRev   uint64    // revision of the lease last seen while another led
	seenAt    time.Time // when seenRev was first seen
	lastFlush time.Time
	nextDue   time.Time // when the first capped tenant not due in the last pick is due
	backlog   jetstream.Stream
	delivery  jetstream.Stream
	cons      jetstream.Consumer
	tenantsKV jetstream.KeyValue
}

// tenant is one tenant in the leader's round robin.
type tenant struct {
	id      string
	depth   uint64  // waiting jobs, as last read (less those moved since)
	weight  float64 // from FairOptions.Weights
	deficit float64 // jobs it may still take in this turn (deficit round robin)
	cursor  uint64  // the backlog sequence its next job is at or after
	next    time.Time
}

// count is a tenant's delivered count: base as read from the bucket, plus moved since.
type count struct {
	base, moved, flushed uint64
	loaded               bool
}

// Fair returns the scheduler of fair queue name. It returns ErrUnknownQueue when name is not
// a provisioned fair queue (or, with opts.Drain, not a provisioned queue).
func (q *Queues) Fair(name string, opts FairOptions) (*Fair, error) {
	if s, ok := q.spec(name); !ok || !s.Fair && !opts.Drain {
		return nil, fmt.Errorf("%w: %q (not a fair queue)", ErrUnknownQueue, name)
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	f := &Fair{q: q, queue: name, owner: hex.EncodeToString(id[:]), byID: map[string]*tenant{}, counts: map[string]*count{}}
	f.SetOptions(opts)
	return f, nil
}

// SetOptions changes the scheduler's options from its next round on.
func (f *Fair) SetOptions(opts FairOptions) {
	opts.Target = max(opts.Target, 1)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	f.mu.Lock()
	f.opts = opts
	f.mu.Unlock()
}

// Options returns the scheduler's options.
func (f *Fair) Options() FairOptions {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.opts
}

func (f *Fair) leaseKey() string { return "fair." + f.queue }

// Run schedules the queue until ctx ends: it takes the lease when no other scheduler holds
// it, and while it holds it, keeps FairOptions.Target jobs waiting in the delivery stream,
// chosen from the tenants' backlogs in weighted round robin. Failures are logged and retried.
// It returns nil, after giving the lease up, when ctx ends or (FairOptions.Drain) the backlogs
// are empty.
func (f *Fair) Run(ctx context.Context) error {
	if f.Options().Drain {
		if _, err := f.q.js.Stream(ctx, f.q.backlogStreamName(f.queue)); errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil // never fair: nothing to drain
		}
	}
	defer f.release()
	var lastLease time.Time
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		if time.Since(lastLease) >= leaseRenew || f.leaseRev == 0 {
			led := f.leaseRev != 0
			if err := f.lease(ctx); err != nil && ctx.Err() == nil {
				f.Options().Logger.Warn("queue: fair scheduler lease", "queue", f.queue, "err", err)
			}
			lastLease = time.Now()
			if led != (f.leaseRev != 0) {
				f.Options().Logger.Info("queue: fair scheduler", "queue", f.queue, "leading", f.leaseRev != 0)
				f.reset()
			}
		}
		if f.leaseRev == 0 {
			sleep(ctx, leaseRenew)
			continue
		}
		moved, err := f.round(ctx)
		if f.Options().Drain && (errors.Is(err, jetstream.ErrStreamNotFound) || err == nil && len(f.ring) == 0) {
			break // nothing (left) to drain
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			f.Options().Logger.Warn("queue: fair scheduler; retrying", "queue", f.queue, "err", err, "retry_in", backoff)
			sleep(ctx, backoff)
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		if time.Since(f.lastFlush) >= flushEvery {
			f.flush(ctx)
		}
		if moved == 0 {
			// Until the next capped tenant is due, if that is sooner: a release polled up to
			// pollEvery late would leave a capped tenant well short of its cap.
			d := pollEvery
			if !f.nextDue.IsZero() {
				d = min(d, max(time.Until(f.nextDue), time.Millisecond))
			}
			sleep(ctx, d)
		}
	}
	f.flush(context.Background())
	return nil
}

// reset forgets the leader's state, which another leader may have changed meanwhile.
func (f *Fair) reset() {
	f.ring, f.byID, f.pos, f.refreshed = nil, map[string]*tenant{}, 0, time.Time{}
	f.cmu.Lock()
	f.counts = map[string]*count{}
	f.cmu.Unlock()
}

// lease takes, renews or loses the queue's lease in the meta bucket. The lease is an entry
// whose revision its holder advances every leaseRenew; another process takes it over (by
// compare-and-set on the revision it saw) once the revision has stood still for leaseExpire on
// its own clock, so no clocks are compared.
func (f *Fair) lease(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	kv := f.q.meta
	if f.leaseRev != 0 {
		rev, err := kv.Update(ctx, f.leaseKey(), []byte(f.owner), f.leaseRev)
		if err != nil {
			f.leaseRev = 0
			return err
		}
		f.leaseRev = rev
		return nil
	}
	e, err := kv.Get(ctx, f.leaseKey())
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		rev, err := kv.Create(ctx, f.leaseKey(), []byte(f.owner))
		if err == nil {
			f.leaseRev = rev
		}
		return ignoreExists(err)
	case err != nil:
		return err
	}
	if len(e.Value()) != 0 { // held (an empty value is a lease given up)
		if e.Revision() != f.seenRev {
			f.seenRev, f.seenAt = e.Revision(), time.Now()
			return nil
		}
		if time.Since(f.seenAt) < leaseExpire {
			return nil
		}
	}
	rev, err := kv.Update(ctx, f.leaseKey(), []byte(f.owner), e.Revision())
	if err == nil {
		f.leaseRev = rev
	}
	return ignoreExists(err)
}

func ignoreExists(err error) error {
	var apiErr *jetstream.APIError
	if errors.Is(err, jetstream.ErrKeyExists) || (errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence) {
		return nil // another process was quicker
	}
	return err
}

// release gives the lease up, so that another process takes over at once.
func (f *Fair) release() {
	if f.leaseRev == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _ = f.q.meta.Update(ctx, f.leaseKey(), nil, f.leaseRev) // empty: free to take
	f.leaseRev = 0
}

// open finds the streams and the consumer the leader works with.
func (f *Fair) open(ctx context.Context) error {
	if f.cons != nil {
		return nil
	}
	var err error
	if f.backlog, err = f.q.js.Stream(ctx, f.q.backlogStreamName(f.queue)); err != nil {
		return err
	}
	if f.delivery, err = f.q.js.Stream(ctx, f.q.streamName(f.queue)); err != nil {
		return err
	}
	if f.tenantsKV, err = f.q.js.KeyValue(ctx, f.q.tenantsBucketName()); err != nil {
		return err
	}
	f.cons, err = f.delivery.Consumer(ctx, consumerName)
	return err
}

// round tops the delivery stream up to Target and returns how many jobs it moved.
func (f *Fair) round(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if err := f.open(ctx); err != nil {
		return 0, err
	}
	opts := f.Options()
	if since := time.Since(f.refreshed); since >= refreshEvery || (len(f.ring) == 0 && since >= refreshIdle) {
		if err := f.refresh(ctx, opts); err != nil {
			return 0, err
		}
	}
	if len(f.ring) == 0 {
		return 0, nil
	}
	ci, err := f.cons.Info(ctx)
	if err != nil {
		return 0, err
	}
	need := opts.Target - int(ci.NumPending)
	if need <= 0 {
		return 0, nil
	}
	picks := f.pick(need, opts, time.Now())
	return f.move(ctx, picks), nil
}

// refresh rereads which tenants have waiting jobs, and how many: tenants new to the ring join
// it at its end, tenants without jobs leave it.
func (f *Fair) refresh(ctx context.Context, opts FairOptions) error {
	depths, _, err := f.q.backlogDepths(ctx, f.backlog, f.queue)
	if err != nil {
		return err
	}
	f.refreshed = time.Now()
	kept := f.ring[:0]
	for i, t := range f.ring {
		n, ok := depths[t.id]
		if !ok {
			delete(f.byID, t.id)
			if i < f.pos {
				f.pos--
			}
			continue
		}
		t.depth = n
		kept = append(kept, t)
	}
	clear(f.ring[len(kept):])
	f.ring = kept
	// New tenants join in a stable order, so that each refresh treats them alike.
	news := make([]string, 0)
	for id := range depths {
		if _, ok := f.byID[id]; !ok {
			news = append(news, id)
		}
	}
	slices.Sort(news)
	for _, id := range news {
		t := &tenant{id: id, depth: depths[id]}
		f.byID[id] = t
		f.ring = append(f.ring, t)
	}
	for _, t := range f.ring {
		t.weight = 1
		if w, ok := opts.Weights[t.id]; ok && w > 0 {
			t.weight = w
		}
	}
	if f.pos >= len(f.ring) {
		f.pos = 0
	}
	return nil
}

// pick chooses up to n jobs by deficit round robin over the ring: a tenant's turn adds its
// weight to its deficit, and it gives one job for each whole unit of it, so over a full round
// tenants give jobs in proportion to their weights. A tenant whose turn is cut short by n keeps
// its place and deficit for the next call. Tenants under their TenantRate cap give only the
// jobs the cap allows now. It returns the jobs per tenant, in the order first chosen.
func (f *Fair) pick(n int, opts FairOptions, now time.Time) []pickN {
	f.nextDue = time.Time{}
	var out []pickN
	idle := 0 // turns in a row that gave nothing: a whole round of them ends the call
	for n > 0 && len(f.ring) > 0 && idle <= len(f.ring) {
		t := f.ring[f.pos]
		if t.deficit < 1 {
			t.deficit += t.weight
		}
		k := min(int(t.deficit), n, int(min(t.depth, uint64(n))))
		capped := false // the cap holds the tenant back now
		if k > 0 && opts.TenantRate > 0 {
			if a := f.allowed(t, opts.TenantRate, now); a == 0 {
				k, capped = 0, true
			} else {
				k = min(k, a)
			}
		}
		if k > 0 {
			t.deficit -= float64(k)
			t.depth -= uint64(k)
			n -= k
			out = appendPick(out, t, k)
			idle = 0
		} else {
			idle++
		}
		if t.deficit >= 1 && t.depth > 0 && n == 0 {
			break // its turn goes on next time
		}
		if t.depth == 0 || capped {
			t.deficit = 0 // an empty or capped tenant does not save up turns
		}
		f.pos = (f.pos + 1) % len(f.ring)
	}
	return out
}

// allowed is how many jobs tenant t may release now under a cap of rate per second, spaced
// 1/rate apart (GCRA, burst 1); it spends them.
func (f *Fair) allowed(t *tenant, rate float64, now time.Time) int {
	if t.next.After(now) {
		if f.nextDue.IsZero() || t.next.Before(f.nextDue) {
			f.nextDue = t.next
		}
		return 0
	}
	t.next = now.Add(time.Duration(float64(time.Second) / rate))
	return 1
}

// pickN is one tenant's share of a round.
type pickN struct {
	t *tenant
	n int
}

func appendPick(out []pickN, t *tenant, k int) []pickN {
	for i := range out {
		if out[i].t == t {
			out[i].n += k
			return out
		}
	}
	return append(out, pickN{t, k})
}

// move moves the picked jobs, tenants in parallel and each tenant's in order, and returns how
// many it moved. A tenant found empty leaves the ring at the next refresh.
func (f *Fair) move(ctx context.Context, picks []pickN) int {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int
		sem   = make(chan struct{}, moveParallel)
	)
	for _, p := range picks {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			n, err := f.moveTenant(ctx, p.t, p.n)
			if err != nil && ctx.Err() == nil {
				f.Options().Logger.Warn("queue: fair scheduler: move", "queue", f.queue, "tenant", p.t.id, "err", err)
			}
			mu.Lock()
			total += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	return total
}

// moveTenant moves up to n of tenant t's oldest jobs to the delivery stream: they are read
// from the backlog in one batch, published to the delivery stream under their own message ids,
// and purged from the backlog once those publishes are acknowledged. A crash in between leaves
// a job in both; the next leader moves it again, and the delivery stream drops the second copy
// as a duplicate of its message id (within Spec.StreamDuplicates).
func (f *Fair) moveTenant(ctx context.Context, t *tenant, n int) (int, error) {
	subj := f.q.backlogSubject(f.queue, t.id)
	var (
		raws []*jetstream.RawStreamMsg
		err  error
	)
	if n == 1 { // the connection's shared reply subscription, no inbox of its own
		var raw *jetstream.RawStreamMsg
		if raw, err = f.backlog.GetMsg(ctx, t.cursor, jetstream.WithGetMsgSubject(subj)); err == nil {
			raws = append(raws, raw)
		} else if errors.Is(err, jetstream.ErrMsgNotFound) {
			err = nil
		}
	} else {
		raws, err = f.getBatch(ctx, subj, t.cursor, n)
	}
	if len(raws) < n && err == nil {
		t.depth = 0 // all there was
	}
	futs := make([]jetstream.PubAckFuture, 0, len(raws))
	for _, raw := range raws {
		m := nats.NewMsg(f.q.jobSubject(f.queue, jobIDOf(raw)))
		for k, v := range raw.Header {
			if !strings.HasPrefix(k, "Nats-") {
				m.Header[k] = v
			}
		}
		if m.Header.Get(hdrStored) == "" {
			m.Header.Set(hdrStored, strconv.FormatInt(raw.Time.UnixNano(), 10))
		}
		m.Header.Set(hdrMsgID, raw.Header.Get(hdrMsgID))
		m.Header.Set(hdrExpectedStream, f.q.streamName(f.queue))
		m.Data = raw.Data
		fut, perr := f.q.pub.PublishMsgAsync(m)
		if perr != nil {
			err = cmp.Or(err, perr)
			break
		}
		futs = append(futs, fut)
	}
	// Up to the first job whose copy is not acknowledged, the tenant's jobs are all moved. Once
	// copies are sent, the move is finished even when ctx ends (a scheduler stopping): a job
	// left in both streams would be moved again, and delivered twice after the duplicate window.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	moved := 0
	for _, fut := range futs {
		select {
		case <-fut.Ok():
			moved++
			continue
		case e := <-fut.Err():
			err = cmp.Or(err, e)
		case <-fctx.Done():
			err = cmp.Or(err, fctx.Err())
		}
		break
	}
	if moved > 0 {
		upTo := raws[moved-1].Sequence + 1
		var e error
		if moved == 1 {
			e = f.backlog.DeleteMsg(fctx, raws[0].Sequence)
		} else {
			e = f.backlog.Purge(fctx, jetstream.WithPurgeSubject(subj), jetstream.WithPurgeSequence(upTo))
		}
		if errors.Is(e, jetstream.ErrMsgNotFound) {
			e = nil // canceled meanwhile
		}
		if e != nil {
			err = cmp.Or(err, e) // moved again by a later round, and dropped as duplicates
		} else {
			t.cursor = upTo
		}
	}
	f.countMoved(t.id, moved)
	return moved, err
}

// getBatch reads up to n messages on subj from sequence from on, with one batched direct get
// (nats.go has no call for it): the server answers each message to an inbox, then an
// end-of-batch status, or 404 when there is none.
func (f *Fair) getBatch(ctx context.Context, subj string, from uint64, n int) ([]*jetstream.RawStreamMsg, error) {
	inbox := f.q.nc.NewRespInbox()
	sub, err := f.q.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	req := fmt.Appendf(nil, `{"seq":%d,"next_by_subj":%q,"batch":%d}`, max(from, 1), subj, n)
	if err := f.q.nc.PublishRequest("$JS.API.DIRECT.GET."+f.q.backlogStreamName(f.queue), inbox, req); err != nil {
		return nil, err
	}
	var out []*jetstream.RawStreamMsg
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return out, err
		}
		switch status := m.Header.Get("Status"); status {
		case "":
		case "404", "204": // none, or the end of the batch
			return out, nil
		default:
			return out, fmt.Errorf("queue: direct get %s: status %s %s", subj, status, m.Header.Get("Description"))
		}
		seq, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
		if err != nil {
			return out, fmt.Errorf("queue: direct get %s: sequence: %w", subj, err)
		}
		ts, _ := time.Parse(time.RFC3339Nano, m.Header.Get("Nats-Time-Stamp"))
		out = append(out, &jetstream.RawStreamMsg{Subject: subj, Sequence: seq, Header: m.Header, Data: m.Data, Time: ts})
	}
}

func (f *Fair) countMoved(id string, n int) {
	if n == 0 {
		return
	}
	f.cmu.Lock()
	defer f.cmu.Unlock()
	c := f.counts[id]
	if c == nil {
		c = &count{}
		f.counts[id] = c
	}
	c.moved += uint64(n)
}

// jobIDOf is the job id of a backlog message: its message id, less the suffix a withdrawn
// publish's retry adds (see Publish).
func jobIDOf(raw *jetstream.RawStreamMsg) string {
	id := raw.Header.Get(hdrMsgID)
	if i := strings.IndexByte(id, '.'); i > 0 {
		id = id[:i]
	}
	return id
}

// flush writes the delivered counts that changed: each tenant's entry, read once per
// leadership, plus what this leader moved since.
func (f *Fair) flush(ctx context.Context) {
	f.lastFlush = time.Now()
	if f.tenantsKV == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	f.cmu.Lock()
	var dirty []string
	for id, c := range f.counts {
		if c.moved != c.flushed {
			dirty = append(dirty, id)
		}
	}
	f.cmu.Unlock()
	sem := make(chan struct{}, moveParallel)
	var wg sync.WaitGroup
	for _, id := range dirty {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			f.flushOne(ctx, id)
		}()
	}
	wg.Wait()
}

func (f *Fair) flushOne(ctx context.Context, id string) {
	key := countKey(f.queue, id)
	f.cmu.Lock()
	c := f.counts[id]
	loaded := c.loaded
	f.cmu.Unlock()
	if !loaded {
		var base uint64
		e, err := f.tenantsKV.Get(ctx, key)
		if err == nil {
			base, _ = strconv.ParseUint(string(e.Value()), 10, 64)
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return
		}
		f.cmu.Lock()
		c.base, c.loaded = base, true
		f.cmu.Unlock()
	}
	f.cmu.Lock()
	moved, total := c.moved, c.base+c.moved
	f.cmu.Unlock()
	if _, err := f.tenantsKV.Put(ctx, key, strconv.AppendUint(nil, total, 10)); err == nil {
		f.cmu.Lock()
		c.flushed = moved
		f.cmu.Unlock()
	}
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
