package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Counting the jobs of shared queues without listing a shared stream's subjects. A job has a
// subject of its own, so a listing of a stream's subjects (StreamInfo with a subjects filter)
// is one entry per job, and nats-server builds it holding the stream's lock: beside a queue
// that no worker serves with 130 000 jobs, one listing took 0.8-0.9 s and the stores in that
// stream waited up to 150-200 ms for it (TestSharedCountsListNoSubjects, docs/design/
// scale.md). The periodic passes (the workers' Waiting every 5 s, the ingress's Counts every
// minute, a status read's rescan for former streams) therefore never list them:
//
//   - a queue with a consumer on a stream: its consumer's pending and unacknowledged jobs
//     (one paged listing of the stream's consumers);
//   - a queue without a consumer on its current stream, when the stream holds messages its
//     consumers do not count: its ledger's tickets (one paged listing of the ledgers, and one
//     of the schedule streams, whose jobs hold tickets too) less the jobs its consumers count
//     elsewhere and, with Counts, its own former stream's;
//   - a former shared stream without the queue's consumer: one read of the queue's first job
//     there (STREAM.MSG.GET by subject), only for queues whose tickets exceed what the above
//     found, only on streams holding more messages than consumers and tickets account for,
//     and a "none there" is kept until the next Provision or for walkAgain.
//
// What a ticket counts differs from the stream's jobs (docs/design/queue.md, "Admission"): a
// ticket whose worker died between the job's acknowledgement and its release counts until a
// ledger sweep removes it (10 minutes at least), so the queue is counted (and found waiting)
// a job too many meanwhile; a job without a ticket — a dead letter replayed, a job stored
// before the ledgers — is found when the tickets leave its stream's messages unexplained: one
// read per provisioned queue without a consumer there, a "none" kept for walkAgain, so it
// waits at most walkAgain for a runner when its bell was lost (findUnticketed). Info still
// lists a queue's subjects, on demand.

// walkAgain is how long a scan keeps a queue's absence from a former shared stream before it
// reads that stream again for it.
const walkAgain = time.Minute

// absentKey names a queue's absence from shared stream k.
type absentKey struct{ queue, k string }

// sharedScan returns the Counts of the queues with jobs in shared streams: Depth as Waiting
// says; with left, the Left of every shared queue that has a consumer in its current stream
// (its ack floor, which counts redeliveries too), which lists the consumers of the shared
// streams that hold none. It returns too, by provisioned queue, its former streams: its own
// stream while it is shared (from the last Provision), and the shared streams other than its
// current one that hold its jobs. own, when given, are the jobs in the queues' own streams
// (for a queue moving to a shared stream, its former own stream's: its tickets count them).
func (q *core) sharedScan(ctx context.Context, left bool, own map[string]uint64) (map[string]Counts, map[string][]string, error) {
	var streams []*scanned
	err := q.listStreams(ctx, q.sharedRoot()+">", q.opts.Prefix+"_J_", func(k string, s jetstream.StreamState) {
		if s.Msgs > 0 || (left && s.Consumers > 0) {
			streams = append(streams, &scanned{k: k, state: s, cons: map[string]bool{}})
		}
	})
	out, formers := map[string]Counts{}, map[string][]string{}
	q.ownFormers(formers)
	if err != nil {
		return out, formers, err
	}
	unowned := false
	for _, h := range streams {
		if err := q.scanConsumers(ctx, h, out, formers); err != nil {
			return out, formers, err
		}
		unowned = unowned || h.unowned > 0
	}
	if unowned {
		if err := q.countByTickets(ctx, streams, own, out, formers); err != nil {
			return out, formers, err
		}
	}
	q.formerSeen.Store(&formerSnap{at: q.now(), m: formers})
	return out, formers, nil
}

// scanned is a shared stream as sharedScan reads it: its state, the queues with a consumer on
// it, and how many of its messages those consumers do not count (unowned).
type scanned struct {
	k       string
	state   jetstream.StreamState
	st      jetstream.Stream
	cons    map[string]bool
	unowned uint64
}

// scanConsumers counts into out the jobs of h's consumers (formers: the queues for which h is
// a former stream), and sets h.unowned.
func (q *core) scanConsumers(ctx context.Context, h *scanned, out map[string]Counts, formers map[string][]string) error {
	name := q.opts.Prefix + "_J_" + h.k
	var err error
	if h.st, err = q.sharedStream(ctx, h.k); err != nil {
		return err
	}
	var counted uint64
	if h.state.Consumers > 0 {
		l := h.st.ListConsumers(ctx)
		for ci := range l.Info() {
			h.cons[ci.Name] = true
			c := out[ci.Name]
			depth := ci.NumPending + uint64(ci.NumAckPending)
			c.Depth += depth
			if q.formerOf(ci.Name, h.k) {
				if depth > 0 {
					formers[ci.Name] = append(formers[ci.Name], name)
				}
			} else {
				c.Left = ci.AckFloor.Consumer
			}
			out[ci.Name] = c
			counted += depth
		}
		if err := l.Err(); err != nil {
			return fmt.Errorf("queue: consumers of %s: %w", name, err)
		}
	}
	if counted >= h.state.Msgs {
		return nil
	}
	// A served queue's jobs acknowledged between the two listings look unowned: the
	// stream read again (a drain only lowers it; a job stored since is its consumer's or
	// unowned), the lower of the two.
	si, err := h.st.Info(ctx)
	if err != nil {
		return fmt.Errorf("queue: %s: %w", name, err)
	}
	if msgs := min(h.state.Msgs, si.State.Msgs); counted < msgs {
		h.unowned = msgs - counted
	}
	return nil
}

// countByTickets counts into out the jobs of the queues without a consumer on the streams
// holding unowned messages, by their tickets; formers gets the former streams found.
func (q *core) countByTickets(ctx context.Context, streams []*scanned, own map[string]uint64, out map[string]Counts, formers map[string][]string) error {
	// Jobs of queues without a consumer: by their tickets.
	rest, foreign, err := q.untracked(ctx, out, own)
	if err != nil {
		return err
	}
	byK := map[string]*scanned{}
	for _, h := range streams {
		byK[h.k] = h
	}
	// Every queue with tickets unaccounted for and no consumer on its current stream, when that
	// stream holds unowned messages, is counted (a ticket left by a crash must not hide another
	// queue's job); what the tickets leave unexplained is looked for in former streams.
	counted := map[string]bool{}
	unexplained := map[*scanned]uint64{}
	for _, h := range streams {
		unexplained[h] = h.unowned
	}
	for name, n := range rest {
		k, shared := q.sharedIndex(name)
		if h := byK[strconv.Itoa(k)]; shared && h != nil && h.unowned > 0 && !h.cons[name] {
			c := out[name]
			c.Depth += n
			out[name] = c
			counted[name] = true
			unexplained[h] -= min(unexplained[h], n)
		}
	}
	for name, n := range rest {
		for _, h := range streams {
			if unexplained[h] == 0 || h.cons[name] || !q.formerOf(name, h.k) {
				continue
			}
			found, err := q.probeFormer(ctx, h.st, h.k, name, h.state.FirstSeq)
			if err != nil {
				return fmt.Errorf("queue: jobs of %q in %s: %w", name, h.st.CachedInfo().Config.Name, err)
			}
			if !found {
				continue
			}
			formers[name] = append(formers[name], q.opts.Prefix+"_J_"+h.k)
			if !counted[name] {
				c := out[name]
				c.Depth += n
				out[name] = c
				counted[name] = true
			}
		}
	}
	// A queue this process does not provision (another deployment's config, one no worker
	// serves) explains by its tickets the stream its name hashes to, as if it were a plain
	// queue: where it is not (fair, prioritised), a job without a ticket beside its jobs waits
	// for its bell or its queue's next job.
	for name, n := range foreign {
		if q.opts.SharedStreams == 0 { // the streams are former ones here: where it is, unknown
			break
		}
		if h := byK[strconv.Itoa(sharedSlot(name, q.opts.SharedStreams))]; h != nil {
			unexplained[h] -= min(unexplained[h], n)
		}
	}
	return q.findUnticketed(ctx, streams, unexplained, counted, out)
}

// findUnticketed looks, in each stream of streams that holds messages unexplained, for the jobs that carry no ticket (a dead
// letter replayed; a job stored before the ledgers) of the provisioned queues on it that have
// no consumer there and were not counted: one read of the queue's first job there, by subject,
// a "none" kept as probeFormer keeps it. A queue found is counted with one job, enough for its
// runner to start. So such a job, whose bell was lost (published while no worker ran), waits
// at most walkAgain for its runner, not for its queue's next job.
func (q *core) findUnticketed(ctx context.Context, streams []*scanned, unexplained map[*scanned]uint64, counted map[string]bool, out map[string]Counts) error {
	for _, h := range streams {
		if unexplained[h] == 0 {
			continue
		}
		q.mu.RLock()
		var names []string
		for name := range q.specs {
			if k, shared := q.sharedIndex(name); shared && strconv.Itoa(k) == h.k && !counted[name] && !h.cons[name] {
				names = append(names, name)
			}
		}
		q.mu.RUnlock()
		for _, name := range names {
			found, err := q.probeFormer(ctx, h.st, h.k, name, h.state.FirstSeq)
			if err != nil {
				return fmt.Errorf("queue: jobs of %q in %s: %w", name, h.st.CachedInfo().Config.Name, err)
			}
			if found {
				c := out[name]
				c.Depth = max(c.Depth, 1)
				out[name] = c
			}
		}
	}
	return nil
}

// untracked returns, by provisioned queue, its tickets that nothing in found (the depths its
// consumers count) or own (its own stream's jobs) accounts for, less its scheduled jobs: the
// jobs of the queue that wait in a shared stream where it has no consumer; and the tickets of
// the queues not provisioned here (foreign). One paged listing of the ledgers, and one of the
// schedule streams when a queue has such tickets.
func (q *core) untracked(ctx context.Context, found map[string]Counts, own map[string]uint64) (rest, foreign map[string]uint64, err error) {
	tickets, err := Deliveries{q}.Ledgers(ctx)
	if err != nil {
		return nil, nil, err
	}
	rest, foreign = map[string]uint64{}, map[string]uint64{}
	for name, n := range tickets {
		if _, ok := q.spec(name); !ok {
			foreign[name] = n
			continue
		}
		if known := found[name].Depth + own[name]; n > known {
			rest[name] = n - known
		}
	}
	if len(rest) == 0 {
		return rest, foreign, nil
	}
	err = q.listStreams(ctx, q.opts.Prefix+".s.>", q.schedStreamPrefix(), func(name string, s jetstream.StreamState) {
		if n, ok := rest[name]; ok {
			if n > s.Msgs {
				rest[name] = n - s.Msgs
			} else {
				delete(rest, name)
			}
		}
	})
	return rest, foreign, err
}

// probeFormer reports whether queue name has a job in shared stream st (index k), which is not
// its current one: one read of its first message there, by subject (nats-server finds it from
// the subject index without listing), a "no" kept for walkAgain within one Provision.
func (q *core) probeFormer(ctx context.Context, st jetstream.Stream, k, name string, first uint64) (bool, error) {
	key := absentKey{name, k}
	gen := q.provisions.Load()
	if v, ok := q.absent.Load(key); ok {
		a := v.(absence)
		if a.gen == gen && q.now().Sub(a.at) < walkAgain {
			return false, nil
		}
	}
	q.probes.Add(1)
	_, err := st.GetMsg(ctx, max(first, 1), jetstream.WithGetMsgSubject(q.sharedRoot()+k+"."+name+".>"))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		q.absent.Store(key, absence{at: q.now(), gen: gen})
		return false, nil
	}
	if err != nil {
		return false, err
	}
	q.absent.Delete(key)
	return true, nil
}

// absence is when a probe found no job of a queue in a former shared stream, under which
// Provision.
type absence struct {
	at  time.Time
	gen uint64
}
