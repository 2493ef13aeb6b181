package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Browsing a queue's jobs (see docs/design/job-browser.md). Jobs live in three places, and a
// page is read from the one that holds the state asked for, by a scan from a cursor (a stream
// sequence):
//
//   - waiting and in-flight jobs are the messages of the queue's stream, a work queue that
//     admits no second consumer: a page costs one direct get per message read (next message
//     on the queue's subject from the cursor), at most MaxGets, and one status read per job
//     kept, 16 at a time (whose entry tells running and retrying from queued);
//   - dead letters are the messages of its dead-letter stream: one direct get per message
//     read, at most MaxGets;
//   - every other state (succeeded, canceled, and running/retrying/failed as recorded) is in
//     the status bucket, keyed by job id alone: a page scans the bucket's stream from the
//     cursor with an ordered consumer, deleted when the page is done (none is left behind to
//     expire), and keeps the entries of the queue, state and tenant asked for. It reads up to
//     MaxScan entries.
//
// So a rare state or tenant of a small queue in a large stream can take several pages (each
// returns the cursor to go on from), never one unbounded read.

// Browse sources.
const (
	SourceWaiting = "waiting" // the queue's stream: queued, running, retrying
	SourceDead    = "dead"    // the dead-letter stream
	SourceStatus  = "status"  // the status bucket: every recorded state
)

// DefaultMaxScan bounds the status entries one Browse page reads.
const DefaultMaxScan = 5000

// DefaultMaxGets bounds the direct gets of the messages one Browse page of waiting jobs or
// dead letters reads: as many as the largest page.
const DefaultMaxGets = 1000

// BrowseQuery selects a page of a queue's jobs.
type BrowseQuery struct {
	// Source is SourceWaiting, SourceDead or SourceStatus.
	Source string
	// State keeps jobs in that state only; "" keeps all.
	State State
	// Tenant keeps the jobs of that tenant id only; "" keeps all.
	Tenant string
	// Cursor is where to start: 0 for the first page, else a Page's Next.
	Cursor uint64
	// Limit is the page size, 1 to 1000; 0 means 100.
	Limit int
	// MaxScan bounds the status entries read (SourceStatus); 0 means DefaultMaxScan.
	MaxScan int
	// MaxGets bounds the messages read by direct get (SourceWaiting, SourceDead); 0 means
	// DefaultMaxGets.
	MaxGets int
}

// Browsed is one job of a page.
type Browsed struct {
	Status
	// Tenant is Status.Tenant, which Status's JSON leaves out; the admin API shows it.
	TenantID string `json:"tenant,omitempty"`
	// Reason, for a dead letter, is why it was dead-lettered, and LastStatus the upstream's
	// last status.
	Reason     string `json:"reason,omitempty"`
	LastStatus int    `json:"last_status,omitempty"`
}

// Page is one page of Browse.
type Page struct {
	Jobs []Browsed `json:"jobs"`
	// Next is the cursor of the next page; 0 when this page ends the scan.
	Next uint64 `json:"next"`
	// Scanned is how many messages the page read to find Jobs.
	Scanned int `json:"scanned"`
}

// Browse returns a page of queue's jobs from the source q.Source. It returns ErrUnknownQueue
// when queue is not provisioned.
func (q *Queues) Browse(ctx context.Context, queue string, bq BrowseQuery) (Page, error) {
	if _, ok := q.spec(queue); !ok {
		return Page{}, fmt.Errorf("%w: %q", ErrUnknownQueue, queue)
	}
	if bq.Limit <= 0 || bq.Limit > 1000 {
		bq.Limit = 100
	}
	if bq.MaxScan <= 0 {
		bq.MaxScan = DefaultMaxScan
	}
	if bq.MaxGets <= 0 {
		bq.MaxGets = DefaultMaxGets
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	switch bq.Source {
	case SourceWaiting, "":
		page, err := q.scanDirect(ctx, q.streamName(queue), q.subject(queue)+".>", bq, q.keepWaiting(queue, bq))
		if err == nil {
			q.readStates(ctx, &page, bq.State)
		}
		return page, err
	case SourceDead:
		return q.scanDirect(ctx, q.dlqStreamName(queue), q.opts.Prefix+".dlq."+queue+".>", bq, func(m *jetstream.RawStreamMsg) (Browsed, bool) {
			d := deadLetter(queue, m.Header, m.Data, m.Sequence)
			b := Browsed{Status: Status{ID: d.Job.ID, Queue: queue, State: StateFailed, Attempts: d.Attempts,
				CreatedAt: d.Job.CreatedAt, UpdatedAt: d.FailedAt, LastError: d.Reason, DeadLetter: true},
				TenantID: d.Job.Tenant, Reason: d.Reason, LastStatus: d.LastStatus}
			if d.LastStatus != 0 {
				b.Response = &Response{Status: d.LastStatus}
			}
			return b, bq.Tenant == "" || bq.Tenant == d.Job.Tenant
		})
	case SourceStatus:
		keep := func(m jetstream.Msg, _ uint64) (Browsed, bool) {
			var r record
			if op := m.Headers().Get("KV-Operation"); op != "" || json.Unmarshal(m.Data(), &r) != nil {
				return Browsed{}, false
			}
			ok := r.Queue == queue && (bq.State == "" || r.State == bq.State) && (bq.Tenant == "" || r.Tenant == bq.Tenant)
			return Browsed{Status: r.Status, TenantID: r.Tenant}, ok
		}
		return q.scan(ctx, "KV_"+q.bucketName(), bq.Cursor, bq.Limit, bq.MaxScan, keep)
	}
	return Page{}, fmt.Errorf("queue: browse: unknown source %q", bq.Source)
}

// keepWaiting turns a message of queue's stream into its job, queued until readStates reads
// its status entry.
func (q *core) keepWaiting(queue string, bq BrowseQuery) func(*jetstream.RawStreamMsg) (Browsed, bool) {
	return func(m *jetstream.RawStreamMsg) (Browsed, bool) {
		job, err := decode(m.Header, m.Data)
		if err != nil || (bq.Tenant != "" && job.Tenant != bq.Tenant) {
			return Browsed{}, false
		}
		return Browsed{Status: Status{ID: job.ID, Queue: queue, State: StateQueued, CreatedAt: job.CreatedAt,
			UpdatedAt: job.CreatedAt, Seq: m.Sequence}, TenantID: job.Tenant}, true
	}
}

// readStates reads the status entries of the waiting jobs of page, 16 at a time: a job
// running or retrying has one, a queued one most often not. With state set it then keeps the
// jobs in that state only.
func (q *core) readStates(ctx context.Context, page *Page, state State) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range page.Jobs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			b := &page.Jobs[i]
			if r, _, err := q.getRecord(ctx, b.ID); err == nil && !r.State.Terminal() {
				seq := b.Seq
				b.Status, b.Status.Seq = r.Status, seq
			}
		})
	}
	wg.Wait()
	if state != "" {
		page.Jobs = slices.DeleteFunc(page.Jobs, func(b Browsed) bool { return b.State != state })
	}
}

// scanDirect reads the messages of stream on subject from bq.Cursor, one direct get each (a
// work-queue stream admits no second consumer), until bq.Limit are kept, bq.MaxGets are read
// or the stream ends.
func (q *core) scanDirect(ctx context.Context, stream, subject string, bq BrowseQuery,
	keep func(*jetstream.RawStreamMsg) (Browsed, bool)) (Page, error) {
	page := Page{Jobs: []Browsed{}}
	st, err := q.js.Stream(ctx, stream)
	if noStream(err) {
		return page, nil // a dead-letter stream is made by the queue's first dead letter
	}
	if err != nil {
		return page, fmt.Errorf("queue: browse %s: %w", stream, err)
	}
	last := st.CachedInfo().State.LastSeq
	seq := max(bq.Cursor, 1)
	for len(page.Jobs) < bq.Limit && page.Scanned < bq.MaxGets && seq <= last {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return page, fmt.Errorf("queue: browse %s: %w", stream, err)
		}
		page.Scanned++
		seq = m.Sequence + 1
		if b, ok := keep(m); ok {
			page.Jobs = append(page.Jobs, b)
		}
	}
	if seq <= last && (len(page.Jobs) > 0 || page.Scanned >= bq.MaxGets) {
		page.Next = seq
	}
	return page, nil
}

// scan reads stream from sequence from (at least 1) with an ordered consumer and keeps what
// keep keeps, until limit jobs are kept, budget messages are read or the stream ends. The
// consumer is deleted before scan returns: an ordered consumer makes a new one for each fetch
// and deletes the one before, so the last would otherwise stay until InactiveThreshold.
func (q *core) scan(ctx context.Context, stream string, from uint64, limit, budget int,
	keep func(jetstream.Msg, uint64) (Browsed, bool)) (Page, error) {
	page := Page{Jobs: []Browsed{}}
	st, err := q.js.Stream(ctx, stream)
	if err != nil {
		return page, fmt.Errorf("queue: browse %s: %w", stream, err)
	}
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy, InactiveThreshold: 15 * time.Second} // a backstop: the page deletes it
	if from > 1 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	c, err := st.OrderedConsumer(ctx, cfg)
	if err != nil {
		return page, fmt.Errorf("queue: browse %s: %w", stream, err)
	}
	defer func() {
		if ci := c.CachedInfo(); ci != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
			_ = st.DeleteConsumer(dctx, ci.Name) // else it expires at InactiveThreshold
			cancel()
		}
	}()
	for page.Scanned < budget && len(page.Jobs) < limit {
		batch, err := c.FetchNoWait(min(limit-len(page.Jobs), budget-page.Scanned, 256))
		if err != nil {
			return page, fmt.Errorf("queue: browse %s: %w", stream, err)
		}
		got, end := 0, false
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				continue
			}
			page.Scanned++
			page.Next, end = md.Sequence.Stream+1, md.NumPending == 0
			if b, ok := keep(m, md.Sequence.Stream); ok {
				page.Jobs = append(page.Jobs, b)
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return page, fmt.Errorf("queue: browse %s: %w", stream, err)
		}
		if got == 0 || end {
			page.Next = 0
			break
		}
	}
	return page, nil
}
