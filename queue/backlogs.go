package queue

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Fair queues: where their jobs wait (the tenants' backlogs), what Info and Tenant read of
// them, and [FairLayout], all that their scheduler (package queue/fair) needs of this package.

const (
	// hdrStored carries, on a job moved from its tenant's backlog to the delivery stream, when
	// the job was first stored (Unix nanoseconds): Msg.Timestamp reports that instant, not the
	// move, so the check of late-stored jobs (Job.AckBy) sees the true storage time.
	hdrStored = "Sluice-Stored"
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

func (q *core) backlogStreamName(queue string) string { return q.opts.Prefix + "_T_" + queue }
func (q *core) backlogPrefix(queue string) string     { return q.opts.Prefix + ".t." + queue + "." }
func (q *core) backlogSubject(queue, tenant string, p Priority) string {
	return q.backlogPrefix(queue) + tenantToken(tenant) + backlogLevel(p)
}

// backlogLevel is the suffix of a tenant's backlog subject for its jobs of priority p: none
// for normal (the subject every fair job had before priorities), ".h" or ".l" for high or low.
// A tenant's levels are subjects of the one backlog stream: no stream or consumer more.
func backlogLevel(p Priority) string {
	switch p {
	case PriorityHigh:
		return ".h"
	case PriorityLow:
		return ".l"
	}
	return ""
}

// Levels counts one tenant's waiting jobs by priority, in the order of Priorities: 0 high, 1
// normal, 2 low.
type Levels [3]uint64

// Sum is the tenant's waiting jobs, all levels.
func (l Levels) Sum() uint64 { return l[0] + l[1] + l[2] }

// backlogKey splits the part of a backlog subject after its prefix into the tenant's token and
// the level index. A token has no dots, so the first dot starts the level.
func backlogKey(rest string) (string, int) {
	tok, lvl, _ := strings.Cut(rest, ".")
	switch lvl {
	case "h":
		return tok, 0
	case "l":
		return tok, 2
	}
	return tok, 1
}
func (q *core) tenantsBucketName() string { return q.opts.Prefix + "_TENANTS" }
func (q *core) metaBucketName() string    { return q.opts.Prefix + "_META" }

func countKey(queue, tenant string) string { return queue + "." + tenantToken(tenant) }

// provisionBacklog creates or updates the backlog stream of fair queue s: one subject per
// tenant and level (<tenant>, <tenant>.h, <tenant>.l), the queue's depth limits, direct gets for
// the scheduler. A stream provisioned before levels, with the tenants' subjects only, gets the
// level subjects added by an update; one that has them is left alone (ensureStream).
func (q *core) provisionBacklog(ctx context.Context, s Spec, limit func(int64) int64) error {
	hold := q.backlogHoldConfig()
	st, err := q.ensureStream(ctx, withHoldStamp(jetstream.StreamConfig{
		Name:        q.backlogStreamName(s.Name),
		Description: "Sluice tenants' backlogs of fair queue " + s.Name,
		Subjects:    []string{q.backlogPrefix(s.Name) + "*", q.backlogPrefix(s.Name) + "*.*"},
		Retention:   jetstream.WorkQueuePolicy,
		Discard:     jetstream.DiscardNew,
		MaxMsgs:     limit(s.MaxDepth),
		MaxBytes:    limit(s.MaxBytes),
		Storage:     jetstream.FileStorage,
		Replicas:    s.Replicas,
		Duplicates:  s.StreamDuplicates,
		AllowDirect: true,
	}, hold))
	if err == nil {
		err = q.ensureHoldAs(ctx, st, hold)
	}
	if err != nil {
		return fmt.Errorf("queue: %q: backlog stream %s: %w", s.Name, q.backlogStreamName(s.Name), err)
	}
	err = q.ensureKeyValue(ctx, jetstream.KeyValueConfig{
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

// fairInfo adds the tenants of fair queue name to info.
func (q *core) fairInfo(ctx context.Context, name string, info *Info) error {
	l := q.layout(name, true)
	st, err := q.js.Stream(ctx, l.Backlog)
	if err != nil {
		return fmt.Errorf("queue: info %q: backlogs: %w", name, err)
	}
	depths, msgs, err := l.Depths(ctx, st)
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
	// The tenant's normal subject, then its level subjects: two filters a stream info takes one of.
	subj := q.backlogSubject(name, tenant, PriorityNormal)
	for _, f := range []string{subj, subj + ".*"} {
		si, err := st.Info(ctx, jetstream.WithSubjectFilter(f))
		if err != nil {
			return TenantInfo{}, fmt.Errorf("queue: tenant of %q: %w", name, err)
		}
		for _, n := range si.State.Subjects {
			out.Depth += n
		}
	}
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

// FairLayout is what the scheduler of a fair queue (package queue/fair) works on: the names of
// the queue's backlog stream, delivery stream, consumer and buckets, a JetStream context, and
// the message format between the two streams. [Queues.FairLayout] returns it; the zero value
// is not usable. It is a value, safe to share.
type FairLayout struct {
	// JetStream is the queue layer's context for asynchronous publishes: a future whose
	// acknowledgement never comes fails after 30s instead of waiting for ever.
	JetStream jetstream.JetStream
	// Queue is the queue's name. Fair is whether it is provisioned fair now; a queue that is
	// not may still hold, in its backlogs, jobs of an earlier fair configuration.
	Queue string
	Fair  bool
	// Backlog is the stream of the tenants' backlogs, one subject per tenant and priority
	// (BacklogSubject), work-queue retention, direct gets allowed. It does not exist while the queue was never
	// fair. Its one consumer, Hold, delivers each job's headers to processes that drop them
	// and never acknowledges: a job it delivered leaves the backlog by the acknowledgement
	// HoldAck names (a backlog made before the hold may lack it).
	Backlog string
	Hold    string
	// HasBacklog is whether the Backlog stream existed at the last Provision (or the queue is
	// fair): a queue without one has no leftovers to drain.
	HasBacklog bool
	// Delivery is the stream the workers take jobs from, through the durable pull Consumer.
	Delivery string
	Consumer string
	// Tenants is the bucket of delivered counts: key CountKey(tenant), value the count in
	// decimal; each entry expires 24h after its last write.
	Tenants string
	// Meta is the deployment's settings bucket, where the scheduler's lease is the entry
	// LeaseKey.
	Meta     string
	LeaseKey string

	prefix      string // of the backlog subjects: <prefix>.t.<queue>.
	jobPrefix   string // of the delivery stream's job subjects: <prefix>.q.<queue>.
	costSubject string // <prefix>.fcost.<queue>: see CostSubject
}

// CostSubject is the core NATS subject (no stream stores it) on which workers report the
// reconciled costs of the queue's jobs, for its scheduler to count tenants by their true
// units (package queue/fair: ReportCost).
func (l FairLayout) CostSubject() string { return l.costSubject }

// FairLayout returns the layout of queue name, for its scheduler. It returns ErrUnknownQueue
// when name is not provisioned. The process then receives the hold consumers' deliveries
// (subscribeHold): a scheduler removes moved jobs from the backlog by its hold's
// acknowledgement, which needs them delivered.
func (q *Queues) FairLayout(name string) (FairLayout, error) {
	s, ok := q.spec(name)
	if !ok {
		return FairLayout{}, fmt.Errorf("%w: %q", ErrUnknownQueue, name)
	}
	if s.Fair {
		if err := q.subscribeHold(); err != nil {
			return FairLayout{}, err
		}
	}
	l := q.layout(name, s.Fair)
	q.mu.RLock()
	l.HasBacklog = q.hasBacklog[name]
	q.mu.RUnlock()
	return l, nil
}

// deliveryConsumer is the name of queue's workers' consumer on its delivery stream: "workers",
// or on a shared stream the queue's name (a queue that was fair and is shared now, whose
// backlogs' leftovers are moved there).
func (q *core) deliveryConsumer(queue string) string {
	if _, shared := q.sharedIndex(queue); shared {
		return queue
	}
	return consumerName
}

func (q *core) layout(name string, fair bool) FairLayout {
	return FairLayout{
		JetStream: q.pub, Queue: name, Fair: fair,
		Backlog: q.backlogStreamName(name), Hold: holdName, Delivery: q.streamName(name), Consumer: q.deliveryConsumer(name),
		Tenants: q.tenantsBucketName(), Meta: q.metaBucketName(), LeaseKey: "fair." + name,
		prefix: q.backlogPrefix(name), jobPrefix: q.jobSubject(name, ""),
		costSubject: q.opts.Prefix + ".fcost." + name,
	}
}

// BacklogSubject is the subject of tenant's backlog of jobs of priority p ("" is the queue's
// unnamed tenant).
func (l FairLayout) BacklogSubject(tenant string, p Priority) string {
	return l.prefix + tenantToken(tenant) + backlogLevel(p)
}

// HoldAck is the subject of the acknowledgement by which backlog job seq, once delivered to
// the Hold consumer, leaves the backlog (a request: the server answers once it is removed, and
// ignores, unanswered, a job the consumer has not delivered).
func (l FairLayout) HoldAck(seq uint64) string {
	return "$JS.ACK." + l.Backlog + "." + l.Hold + ".1." + strconv.FormatUint(seq, 10) + ".0.0.0"
}

// CountKey is the key of tenant's delivered count in the Tenants bucket.
func (l FairLayout) CountKey(tenant string) string { return countKey(l.Queue, tenant) }

// Depths returns, from the backlog stream st, how many jobs wait per tenant with any waiting,
// all levels together, and in all: one request, whose answer lists every such tenant's
// subjects.
func (l FairLayout) Depths(ctx context.Context, st jetstream.Stream) (map[string]uint64, uint64, error) {
	depths, msgs, _, err := l.depths(ctx, st)
	return depths, msgs, err
}

// subjectsPage is how many subjects the server lists in one answer to a stream info request
// (its JSMaxSubjectDetails); the client asks for more pages.
const subjectsPage = 100_000

// LevelDepths is Depths by priority: how many jobs of each level wait per tenant with any
// waiting. One request, as Depths. It returns too the backlog's last sequence as the server
// read it before counting the subjects, so that every job at or below it still waiting was
// counted: a subject counted once has at most one job at or below it (the scheduler reads such
// jobs of many tenants in one request). It is 0 when the answer came in pages, each read
// apart.
func (l FairLayout) LevelDepths(ctx context.Context, st jetstream.Stream) (map[string]Levels, uint64, error) {
	si, err := st.Info(ctx, jetstream.WithSubjectFilter(l.prefix+">"))
	if err != nil {
		return nil, 0, err
	}
	out := make(map[string]Levels, len(si.State.Subjects))
	for subj, n := range si.State.Subjects {
		tok, i := backlogKey(strings.TrimPrefix(subj, l.prefix))
		t := tokenTenant(tok)
		lv := out[t]
		lv[i] += n
		out[t] = lv
	}
	last := si.State.LastSeq
	if len(si.State.Subjects) >= subjectsPage {
		last = 0
	}
	return out, last, nil
}

// depths is Depths, with the stream's last sequence in the same reading. A tenant is one
// tenant whatever its levels: the level token is not part of its key.
func (l FairLayout) depths(ctx context.Context, st jetstream.Stream) (map[string]uint64, uint64, uint64, error) {
	si, err := st.Info(ctx, jetstream.WithSubjectFilter(l.prefix+">"))
	if err != nil {
		return nil, 0, 0, err
	}
	out := make(map[string]uint64, len(si.State.Subjects))
	for subj, n := range si.State.Subjects {
		tok, _ := backlogKey(strings.TrimPrefix(subj, l.prefix))
		out[tokenTenant(tok)] += n
	}
	return out, si.State.Msgs, si.State.LastSeq, nil
}

// Forward returns the delivery-stream message of raw, a job read from a backlog: the job's
// subject by id, its headers (less the server's Nats-* ones), its storage time kept in a
// header for Msg.Timestamp, its message id, so that the delivery stream drops a second copy
// within Spec.StreamDuplicates, and the delivery stream expected.
func (l FairLayout) Forward(raw *jetstream.RawStreamMsg) *nats.Msg {
	id := raw.Header.Get(hdrMsgID)
	m := nats.NewMsg(l.jobPrefix + jobIDOf(id))
	for k, v := range raw.Header {
		if !strings.HasPrefix(k, "Nats-") {
			m.Header[k] = v
		}
	}
	if m.Header.Get(hdrStored) == "" {
		m.Header.Set(hdrStored, strconv.FormatInt(raw.Time.UnixNano(), 10))
	}
	m.Header.Set(hdrMsgID, id)
	m.Header.Set(hdrExpectedStream, l.Delivery)
	m.Data = raw.Data
	return m
}

// Cost is the cost of raw's job in its queue's units, as the queue read it when the job was
// accepted (Job.Cost): at least 1, the cost of a job of a queue without cost_rate and of a
// message whose job cannot be read. It reads the job's envelope, not its body.
func (l FairLayout) Cost(raw *jetstream.RawStreamMsg) int64 {
	var j Job
	if meta := raw.Header.Get(hdrJob); !readEnvelope(meta, &j) {
		j = Job{}
		if json.Unmarshal([]byte(meta), &envelope{Job: &j}) != nil {
			return 1
		}
	}
	return max(j.Cost, 1)
}

// jobIDOf is the job id of a backlog message's id: the message id, less the suffix a
// withdrawn publish's retry adds (see Publish).
func jobIDOf(msgID string) string {
	if i := strings.IndexByte(msgID, '.'); i > 0 {
		return msgID[:i]
	}
	return msgID
}
