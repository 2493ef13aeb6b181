package queue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The admission ledger: one bound for every way a job enters a queue.
//
// A queue's jobs wait in up to five streams: its delivery stream, its priority levels, its
// tenants' backlogs (a fair queue) and its schedule stream. Each stream's own limit bounds that
// stream alone, and a schedule stream cannot discard new messages at all (nats-server refuses
// "message scheduling cannot use discard new"), so no stream limit bounds the queue. The
// ledger does: a work-queue stream of its own per queue, <prefix>_L_<queue>, of one small
// message (a ticket) per job the queue holds, waiting, scheduled or in flight, on a subject per
// tenant (<prefix>.l.<queue>.<tenant token>), with DiscardNew, MaxMsgs = Spec.MaxDepth and
// MaxMsgsPerSubject = Spec.TenantMaxDepth (DiscardNewPerSubject). Publish stores a job's ticket
// before the job; the stream leader refuses a ticket beyond either bound, one publish at a time,
// so the bounds hold exactly under any concurrency of any number of processes (ErrFull,
// ErrTenantFull). A job's tickets travel with it in its Sluice-Tickets header (moves copy
// headers) and leave when it leaves the queue: by an acknowledgement of the ledger's hold
// consumer after a worker acked or dead-lettered the job (hold.go: ~6 µs of nats-server's CPU
// where a deletion, a JetStream API request, costs ~30 µs), by deletion when it was canceled or
// not stored after all.
//
// A deferral budget (Job.Budget: a rule's max_waiting_per_key) is a second ledger,
// <prefix>_KW_<budget token>, made by the budget's first job, with a subject per key (an HMAC of
// the key under the id secret: no key is stored) and MaxMsgsPerSubject = Budget.PerKey: one key
// cannot hold more than that many of the rule's jobs at once (ErrBudgetFull).
//
// A ticket is released after its job's acknowledgement, never before: a process that dies in
// between leaves a ticket without a job, which counts against the bound (it errs toward
// refusing) until [Deliveries.SweepLedger], which workers run, finds it. docs/design/queue.md
// has the design and what was rejected.

// hdrTickets carries a job's tickets: "<stream>:<seq>" joined with ",".
const hdrTickets = "Sluice-Tickets"

// Budget is a deferral budget: at most PerKey of Key's jobs wait at once under Name.
type Budget struct {
	// Name names the budget (the ingress: its rule's name); any text.
	Name string
	// Key is the key the budget counts (the ingress: the rule's key for the request): any
	// bytes; only its HMAC under the id secret is stored.
	Key string
	// PerKey is how many of one key's jobs may wait; it must be > 0.
	PerKey int64
}

// ticket is one admission ticket: a message of a ledger stream.
type ticket struct {
	stream string
	seq    uint64
}

// A ledger's and a budget's names: the work-queue ledgers of the hold consumer (hold.go). The
// limits-retention ledgers before them were <prefix>_A_<queue> and <prefix>_K_<token>, on
// <prefix>.a. and <prefix>.k. subjects; nats-server refuses a change of retention, so these are
// new streams, and a ticket of an old one is released by deletion (release).
func (q *core) ledgerName(queue string) string   { return q.opts.Prefix + "_L_" + queue }
func (q *core) ledgerPrefix(queue string) string { return q.opts.Prefix + ".l." + queue + "." }

// budgetToken is the stream-name and subject token of budget name: 16 hex digits of its
// SHA-256 (a name may hold any text).
func budgetToken(name string) string {
	sum := sha256.Sum256([]byte(name))
	return hex.EncodeToString(sum[:8])
}

func (q *core) budgetStreamName(b *Budget) string { return q.budgetStreams() + budgetToken(b.Name) }
func (q *core) budgetStreams() string             { return q.opts.Prefix + "_KW_" }
func (q *core) budgetPrefix(b *Budget) string {
	return q.opts.Prefix + ".kw." + budgetToken(b.Name) + "."
}

// ledgerConfig is the ledger stream of queue s: one ticket per job held, MaxDepth of them, and
// TenantMaxDepth per tenant's subject.
func (q *core) ledgerConfig(s Spec, limit func(int64) int64) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:                 q.ledgerName(s.Name),
		Description:          "Sluice admission ledger of queue " + s.Name,
		Subjects:             []string{q.ledgerPrefix(s.Name) + "*"},
		Retention:            jetstream.WorkQueuePolicy,
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: s.TenantMaxDepth > 0,
		AllowDirect:          true, // the sweep's reads (hold.go)
		MaxMsgs:              limit(s.MaxDepth),
		MaxMsgsPerSubject:    limit(s.TenantMaxDepth),
		Storage:              jetstream.FileStorage,
		Replicas:             s.Replicas,
		Duplicates:           s.StreamDuplicates,
	}
}

// noLimitZero maps a bound of 0 (none) to JetStream's -1.
func noLimitZero(n int64) int64 {
	if n == 0 {
		return -1
	}
	return n
}

// ledgerMakes is how many ledgers a process makes on demand at once.
const ledgerMakes = 8

// provisionLedger creates or updates the ledger stream of queue s. Lowering MaxDepth below
// what the ledger holds refuses new jobs until enough leave (the server trims no DiscardNew
// stream). Lowering TenantMaxDepth, or setting it, makes the server drop each tenant's oldest
// tickets beyond it: a tenant over the new bound is then counted short by that many until its
// jobs leave.
func (q *core) provisionLedger(ctx context.Context, s Spec, limit func(int64) int64) error {
	return q.makeLedger(ctx, s, limit, q.ensureStream)
}

// makeLedger is provisionLedger by ensure: ensureStream, or createStream for a ledger that is
// likely missing (one request where it is).
func (q *core) makeLedger(ctx context.Context, s Spec, limit func(int64) int64, ensure func(context.Context, jetstream.StreamConfig) (jetstream.Stream, error)) error {
	cfg := withHoldStamp(q.ledgerConfig(s, limit), q.holdConfig())
	st, err := ensure(ctx, cfg)
	if err != nil {
		return fmt.Errorf("queue: %q: ledger %s: %w", s.Name, cfg.Name, err)
	}
	if err := q.ensureHold(ctx, st); err != nil {
		return fmt.Errorf("queue: %q: ledger %s: %w", s.Name, cfg.Name, err)
	}
	q.ledgers.Store(cfg.Name, st)
	q.ledgersMade.Store(cfg.Name, struct{}{})
	return nil
}

// ensureBudget makes sure the stream of budget b exists with its size, once per process and
// size (a reload that changes PerKey updates it).
func (q *core) ensureBudget(ctx context.Context, s Spec, b *Budget) error {
	name := q.budgetStreamName(b)
	return q.onDemand(ctx, &q.budgets, name+"/"+strconv.FormatInt(b.PerKey, 10), func(ctx context.Context) error {
		st, err := q.ensureStream(ctx, withHoldStamp(jetstream.StreamConfig{
			Name:                 name,
			Description:          "Sluice deferral budget " + strconv.Quote(b.Name),
			Subjects:             []string{q.budgetPrefix(b) + "*"},
			Retention:            jetstream.WorkQueuePolicy,
			Discard:              jetstream.DiscardNew,
			DiscardNewPerSubject: true,
			MaxMsgsPerSubject:    b.PerKey,
			AllowDirect:          true,
			Storage:              jetstream.FileStorage,
			Replicas:             s.Replicas,
			Duplicates:           s.StreamDuplicates,
		}, q.holdConfig()))
		if err == nil {
			err = q.ensureHold(ctx, st)
		}
		if err != nil {
			return fmt.Errorf("queue: deferral budget %q: stream %s: %w", b.Name, name, err)
		}
		q.ledgers.Store(name, st)
		return nil
	})
}

// admit takes job's tickets, published under msgID (so that a publish repeated within the
// duplicate window takes none twice): its queue's, and its budget's when it has one. The two
// are published together and awaited together (one round trip, not two: neither bound depends
// on the other's ticket, and the job is published only once both are in). It returns the
// tickets this call stored (not those a repeat found), which the caller releases when the job
// is not stored after all. A refusal is ErrFull, ErrTenantFull or ErrBudgetFull (the queue's
// first when both refuse); then no ticket is held: one stored beside a refused one is released,
// and counted until then (toward refusing, as a ticket whose job never came).
func (q *core) admit(ctx context.Context, spec Spec, job *Job, msgID string) ([]ticket, error) {
	b := job.Budget
	budgeted := b != nil && b.PerKey > 0
	if budgeted {
		if err := q.ensureBudget(ctx, spec, b); err != nil {
			return nil, err
		}
	}
	// The queue's first job in this process makes its ledger unless Provision found it, up to
	// ledgerMakes at a time: a burst of first jobs on many queues right after a start does not
	// wait for their ledgers one by one.
	if err := onDemandIn(ctx, q.makingLedgers, &q.ledgersMade, q.ledgerName(spec.Name), func(ctx context.Context) error {
		return q.makeLedger(ctx, spec.withDefaults(), noLimitZero, q.createStream)
	}); err != nil {
		return nil, err
	}
	queueStream, subject := q.ledgerName(spec.Name), q.ledgerPrefix(spec.Name)+tenantToken(job.Tenant)
	qf, qerr := q.sendTicket(queueStream, subject, msgID, job)
	var bf jetstream.PubAckFuture
	var bstream string
	var berr error
	if budgeted {
		bstream = q.budgetStreamName(b)
		bf, berr = q.sendTicket(bstream, q.budgetPrefix(b)+q.ids.TenantID([]byte(b.Key)), msgID, job)
	}
	var owned []ticket
	t, dup, err := q.awaitTicket(ctx, queueStream, qf, qerr, job)
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		// The ledger was deleted behind the queue's back: made again, it counts from here.
		if err = q.provisionLedger(ctx, spec.withDefaults(), noLimitZero); err == nil {
			t, dup, err = q.take(ctx, queueStream, subject, msgID, job)
		}
	}
	if err == nil && !dup {
		owned = append(owned, t)
	}
	tickets := []ticket{t}
	if budgeted {
		bt, bdup, e := q.awaitTicket(ctx, bstream, bf, berr, job)
		if e == nil && !bdup {
			owned = append(owned, bt)
		}
		if err == nil {
			err = e
		}
		tickets = append(tickets, bt)
	}
	if err != nil {
		if ctx.Err() != nil {
			q.releaseLater(owned) // past the caller's deadline: within opTimeout of its own
		} else {
			q.release(ctx, owned)
		}
		job.tickets = nil
		return nil, err
	}
	job.tickets = append(job.tickets[:0], tickets...)
	return owned, nil
}

// take stores one ticket of job on subject of ledger stream and returns it, and whether it
// was a duplicate of one stored before.
func (q *core) take(ctx context.Context, stream, subject, msgID string, job *Job) (ticket, bool, error) {
	f, err := q.sendTicket(stream, subject, msgID, job)
	return q.awaitTicket(ctx, stream, f, err, job)
}

// sendTicket publishes one ticket of job on subject of ledger stream without waiting for it:
// asynchronously, as publish (a reconnect fails the future at once, where a request would
// wait for its deadline). awaitTicket takes the future and the error.
func (q *core) sendTicket(stream, subject, msgID string, job *Job) (jetstream.PubAckFuture, error) {
	vals := []string{msgID, stream}
	m := &nats.Msg{Subject: subject, Data: []byte(job.ID), Header: nats.Header{
		hdrMsgID: vals[0:1:1], hdrExpectedStream: vals[1:2:2],
	}}
	return q.pub.PublishMsgAsync(m, publishOpts...)
}

// awaitTicket waits for the ticket that sendTicket published to stream (f, or its error
// sendErr) and returns it, and whether it was a duplicate of one stored before.
func (q *core) awaitTicket(ctx context.Context, stream string, f jetstream.PubAckFuture, sendErr error, job *Job) (ticket, bool, error) {
	if sendErr != nil {
		return ticket{}, false, publishError(job, sendErr)
	}
	select {
	case ack := <-f.Ok():
		return ticket{stream: stream, seq: ack.Sequence}, ack.Duplicate, nil
	case err := <-f.Err():
		return ticket{}, false, ticketError(job, strings.HasPrefix(stream, q.budgetStreams()), stream, err)
	case <-ctx.Done():
		// Not stored, as far as the caller is told: a ticket that lands after all is released.
		q.releases.Add(1)
		go func() {
			defer q.releases.Done()
			select {
			case ack := <-f.Ok():
				if !ack.Duplicate {
					q.releaseLater([]ticket{{stream: stream, seq: ack.Sequence}})
				}
			case <-f.Err():
			case <-q.closing.Done():
			}
		}()
		return ticket{}, false, publishError(job, ctx.Err())
	}
}

// ticketError maps the refusal of a ticket to the sentinels: the stream's bound (ErrFull), a
// subject's (ErrTenantFull in a queue's ledger, ErrBudgetFull in a budget's).
func ticketError(job *Job, budget bool, stream string, err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == 10077 {
		d := apiErr.Description
		switch {
		case strings.Contains(d, "maximum messages per subject") && budget:
			return fmt.Errorf("%w: queue %q: %w", ErrBudgetFull, job.Queue, err)
		case strings.Contains(d, "maximum messages per subject"):
			return fmt.Errorf("%w: queue %q, tenant %s: %w", ErrTenantFull, job.Queue, job.Tenant, err)
		case strings.Contains(d, "maximum messages"):
			return fmt.Errorf("%w: queue %q: %w", ErrFull, job.Queue, err)
		}
	}
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		return fmt.Errorf("queue: publish %s: ledger %s: %w", job.ID, stream, err)
	}
	return publishError(job, err)
}

// release deletes tickets ts, waiting for each: a refusal's, a Cancel's, a job's not stored
// after all, an old ledger's (a worker's acknowledgement releases by releaseAcked, hold.go). A
// ticket already gone (released twice: a job taken again after a lost ack) is no error; other
// failures are dropped (the ticket then counts until swept, see above).
func (q *core) release(ctx context.Context, ts []ticket) {
	for _, t := range ts {
		st, err := q.ledgerStream(ctx, t.stream)
		if err != nil {
			continue
		}
		_ = st.DeleteMsg(ctx, t.seq)
	}
}

// releaseLater releases ts in the background, within opTimeout; Close waits for it.
func (q *core) releaseLater(ts []ticket) {
	if len(ts) == 0 {
		return
	}
	q.releases.Add(1)
	go func() {
		defer q.releases.Done()
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		q.release(ctx, ts)
	}()
}

// ledgerStream returns ledger stream name, looked up once per process.
func (q *core) ledgerStream(ctx context.Context, name string) (jetstream.Stream, error) {
	if st, ok := q.ledgers.Load(name); ok {
		return st.(jetstream.Stream), nil
	}
	st, err := q.js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	q.ledgers.Store(name, st)
	return st, nil
}

// appendTickets appends the Sluice-Tickets value of ts to b.
func appendTickets(b []byte, ts []ticket) []byte {
	for i, t := range ts {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, t.stream...)
		b = append(b, ':')
		b = strconv.AppendUint(b, t.seq, 10)
	}
	return b
}

// parseTickets reads a Sluice-Tickets value; malformed parts are skipped.
func parseTickets(v string) []ticket {
	if v == "" {
		return nil
	}
	var out []ticket
	for part := range strings.SplitSeq(v, ",") {
		stream, seq, ok := strings.Cut(part, ":")
		n, err := strconv.ParseUint(seq, 10, 64)
		if ok && err == nil && isToken(stream, 255) {
			out = append(out, ticket{stream: stream, seq: n})
		}
	}
	return out
}

// releaseMsg releases the tickets of a job message (its headers h) that leaves the queue
// without a worker's acknowledgement (Cancel).
func (q *core) releaseMsg(ctx context.Context, h nats.Header) {
	q.release(ctx, parseTickets(h.Get(hdrTickets)))
}

// SweepLedger repairs queue name's ledger: it reads up to limit tickets from sequence from on,
// and deletes those older than olderThan whose job is no longer held (its status final, or
// no job by that id): tickets left by a process that died between a job's acknowledgement and
// its ticket's release. olderThan must exceed the longest a publish takes between its ticket
// and its job (Options.PublishTimeout), or a job being stored could lose its ticket. It
// returns how many it deleted and the sequence to start the next sweep at (0: from the first,
// the ledger was read to its young end). Each ticket read costs a status read (up to three).
func (d Deliveries) SweepLedger(ctx context.Context, name string, from uint64, olderThan time.Duration, limit int) (removed int, next uint64, err error) {
	ctx, cancel := withDefaultTimeout(ctx, 4*opTimeout)
	defer cancel()
	removed, next, err = d.sweep(ctx, d.ledgerName(name), from, olderThan, limit)
	if err != nil {
		return removed, 0, fmt.Errorf("queue: sweep the ledger of %q: %w", name, err)
	}
	return removed, next, nil
}

// Ledgers returns the tickets held in each queue's admission ledger, by queue name, for the
// ledgers that exist: one paged stream listing (256 a request), so that a sweep looks only at
// ledgers that hold tickets rather than asking for every queue's.
func (d Deliveries) Ledgers(ctx context.Context) (map[string]uint64, error) {
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	out := map[string]uint64{}
	err := d.listStreams(ctx, d.opts.Prefix+".l.>", d.ledgerName(""), func(name string, s jetstream.StreamState) {
		out[name] = s.Msgs
	})
	return out, err
}

// SweepBudgets is SweepLedger for the deferral budgets' streams (Job.Budget): the first limit
// tickets of each (one stream listing, then as SweepLedger per stream). It returns how many
// it deleted in all.
func (d Deliveries) SweepBudgets(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	ctx, cancel := withDefaultTimeout(ctx, 4*opTimeout)
	defer cancel()
	var names []string
	prefix := d.budgetStreams()
	err := d.listStreams(ctx, d.opts.Prefix+".kw.>", prefix, func(tok string, _ jetstream.StreamState) {
		names = append(names, prefix+tok)
	})
	total := 0
	for _, name := range names {
		n, _, serr := d.sweep(ctx, name, 0, olderThan, limit)
		total += n
		err = errors.Join(err, serr)
	}
	if err != nil {
		return total, fmt.Errorf("queue: sweep the deferral budgets: %w", err)
	}
	return total, nil
}

// sweep is SweepLedger on ledger stream name.
func (q *core) sweep(ctx context.Context, name string, from uint64, olderThan time.Duration, limit int) (removed int, next uint64, err error) {
	st, err := q.ledgerStream(ctx, name)
	if noStream(err) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	tickets, err := q.readTickets(ctx, name, max(from, 1), max(limit, 1))
	if err != nil {
		return 0, 0, err
	}
	cutoff, young, read := q.now().Add(-olderThan), false, len(tickets)
	for _, t := range tickets {
		if t.stored.After(cutoff) {
			young = true // in sequence order: the rest are younger still
			break
		}
		next = t.seq + 1
		s, err := Publisher{q}.Status(ctx, t.job)
		if errors.Is(err, ErrNotFound) || err == nil && s.State.Terminal() {
			if st.DeleteMsg(ctx, t.seq) == nil {
				removed++
			}
		}
	}
	if young || read < limit {
		next = 0
	}
	return removed, next, nil
}
