package queue

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The fetch path (Consumer.Fetch) sends its pull requests itself instead of through nats.go's
// Fetch and FetchNoWait. nats.go subscribes a fresh inbox per fetch and unsubscribes it when it
// stops waiting (1 s after the last message of a no-wait fetch, or at its context's end): the
// jobs the server had sent by then reach no one and stay pending, held by no worker, until
// their AckWait (30 s by default) — a stall of the server or the network of over a second
// delayed them by that much (docs/design/start-window.md).
//
// Model: one subscription per Queues, on "<inbox>.*", made at the first fetch and kept until
// Close; each no-wait pull request asks for replies on "<inbox>.<n>", n new per fetch, and
// each long pull on "<inbox>.l.<n>", subscribed for it and drained at its end (longSub). While its fetch
// waits, a reply goes to it. A job that comes for a fetch that has returned (late) is
//   - handed to a fetch of the same consumer that is waiting in this process, if any: it takes
//     it as one of its jobs;
//   - else kept for the consumer's next Fetch in this process, which returns it first, without
//     asking the server;
//   - and NAK'd when no fetch took it within lateHold (a quarter of AckWait, at most 5 s), so
//     that the server hands it to the next pull of any process at once.
// A late job handed on or kept is the same delivery: its delivery count (Msg.Delivered, the
// worker's attempt count) does not move, and its AckWait runs from when the server sent it, as
// for any fetched job. A NAK'd one is delivered again with a count one higher; before the NAK
// its status record is written with this delivery's count and its attempts as they were
// (recordUnsent), as a worker's pass that sends nothing writes it, so that the next delivery
// counts no attempt for this one: a job of max attempts N still gets N deliveries to its
// upstream. Were that write to fail, the NAK follows anyway, and the job counts this delivery
// as one attempt, as the AckWait redelivery it replaces would (at least 3/4 of an AckWait
// later). Late status messages (404, 408, heartbeats) are dropped.
//
// Costs: no SUB/UNSUB per no-wait fetch (nats.go made two protocol operations and a
// subscription per fetch); a SUB and a drain per long pull; one map lookup per message
// received; a timer per late job; a status read and write per late job NAK'd.

// lateHold is how long a late job waits for a fetch of its consumer in this process before it
// is NAK'd: a quarter of the consumer's AckWait, at most maxLateHold. A worker that is busy
// with its jobs (a throttled queue's leak slot) fetches again within it and takes the job as
// the same delivery, spending no attempt; a process that fetches that queue no more hands it
// back that much later, not an AckWait later. Its AckWait runs meanwhile, as for a job fetched
// and not yet worked on, and is at least 3/4 left when a fetch takes it.
func lateHold(ackWait time.Duration) time.Duration {
	if ackWait <= 0 {
		return time.Second
	}
	return min(ackWait/4, maxLateHold)
}

// maxLateHold bounds lateHold.
const maxLateHold = 5 * time.Second

// noWaitGiveUp is how long a no-wait fetch waits for the server's answer (nats.go's 1 s): a
// fetch must not hang when the server is gone. What comes after it is late, not lost.
const noWaitGiveUp = time.Second

// pulls is the fetch path's subscription and the fetches waiting on it. Its zero value is
// ready; it is safe for concurrent use.
type pulls struct {
	mu     sync.Mutex
	nc     *nats.Conn
	sub    *nats.Subscription
	prefix string // "<inbox>."
	next   uint64
	open   map[string]*pull         // reply token -> the fetch waiting for it
	late   map[string][]*late       // consumer key -> late jobs kept for its next fetch
	holds  map[string]time.Duration // consumer key -> its late jobs' hold (lateHold)
	queues map[string]string        // consumer key -> its queue's name
	closed bool
	// unsent, when set (the core's recordUnsent), records that a late job of a queue was not
	// tried, before its NAK.
	unsent func(ctx context.Context, queue string, m *nats.Msg)
	// hold, when set (a test's SetLateHold), replaces lateHold.
	hold time.Duration
}

// pull is one fetch's wait for its replies.
type pull struct {
	key string             // the consumer: "<stream> <consumer>"
	ch  chan *nats.Msg     // its replies; late jobs handed to it
	sub *nats.Subscription // a long pull's own (longSub); nil: the shared one
}

// longSub: a long pull that its caller cuts short stays waiting at the server until it expires
// (JetStream has no cancel), and the server sends it the consumer's next jobs as long as its
// reply subject has interest. On the shared subscription it always would: those jobs would all
// come late, and wait for lateHold in a process that may fetch that queue no more (a runner
// stopped, a pool replaced). So a long pull replies on a subject of its own, "<inbox>.l.<n>",
// outside the shared wildcard, subscribed for it and drained at its end: the UNSUB tells the
// server that no one waits any more (it drops the request at its next delivery), and the drain
// still receives what the server sent before it (late jobs, kept). A SUB and an UNSUB per long
// pull, as nats.go made; the no-wait fetches, most fetches of a busy queue, share one.

// late is a job that came after its fetch returned, NAK'd by timer unless taken first.
type late struct {
	m     *nats.Msg
	timer *time.Timer
}

// start opens a fetch on consumer key: it subscribes the first time, and returns the pull and
// the reply subject of its request. A long pull (long) gets a subscription of its own, outside
// the shared one's wildcard, that end drains: see longSub. queue names the consumer's queue.
func (p *pulls) start(nc *nats.Conn, key, queue string, ackWait time.Duration, limit int, long bool) (*pull, string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, "", nats.ErrConnectionClosed
	}
	if p.sub == nil {
		prefix := nc.NewInbox() + "."
		sub, err := nc.Subscribe(prefix+"*", p.receive)
		if err != nil {
			return nil, "", fmt.Errorf("subscribe the fetches' replies: %w", err)
		}
		// A slow worker must not make the client drop replies: each fetch's channel is
		// sized to its batch, and the callback never blocks (receive).
		_ = sub.SetPendingLimits(-1, -1)
		p.nc, p.sub, p.prefix = nc, sub, prefix
		p.open, p.late, p.holds = map[string]*pull{}, map[string][]*late{}, map[string]time.Duration{}
		p.queues = map[string]string{}
	}
	p.queues[key] = queue
	p.holds[key] = lateHold(ackWait)
	if p.hold > 0 {
		p.holds[key] = p.hold
	}
	p.next++
	reply := p.prefix + strconv.FormatUint(p.next, 36)
	pl := &pull{key: key, ch: make(chan *nats.Msg, limit+4)}
	if long {
		reply = p.prefix + "l." + strconv.FormatUint(p.next, 36)
		sub, err := nc.Subscribe(reply, p.receive)
		if err != nil {
			return nil, "", fmt.Errorf("subscribe a long pull's replies: %w", err)
		}
		pl.sub = sub
	}
	p.open[reply] = pl
	return pl, reply, nil
}

// end closes a fetch: what comes for it from now on is late, as is what came after it
// stopped reading its replies. A long pull's subscription is drained (longSub).
func (p *pulls) end(reply string, pl *pull) {
	p.mu.Lock()
	delete(p.open, reply)
	for done := false; !done; {
		select {
		case m := <-pl.ch:
			p.lateLocked(m)
		default:
			done = true
		}
	}
	p.mu.Unlock()
	if pl.sub != nil && pl.sub.Drain() != nil {
		_ = pl.sub.Unsubscribe()
	}
}

// receive is the subscription's callback. It never blocks.
func (p *pulls) receive(m *nats.Msg) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pl, ok := p.open[m.Subject]; ok {
		select {
		case pl.ch <- m:
			return
		default: // more than the fetch asked for: the server does not send it, but be safe
		}
	}
	p.lateLocked(m)
}

// lateLocked disposes of m, which no waiting fetch asked for: a status is dropped, a job
// handed to a fetch of its consumer waiting now, or kept for lateHold. p.mu is held.
func (p *pulls) lateLocked(m *nats.Msg) {
	if !isJob(m) {
		return
	}
	if p.closed { // after Close: NAK'd without a record (stop), as the caller stops using q
		p.nak(m)
		return
	}
	key := ""
	if md, err := m.Metadata(); err == nil {
		key = md.Stream + " " + md.Consumer
	}
	for _, pl := range p.open {
		if pl.key == key {
			select {
			case pl.ch <- m:
				return
			default:
			}
		}
	}
	hold, ok := p.holds[key]
	if !ok { // a consumer this process never fetched from
		hold = lateHold(0)
	}
	l := &late{m: m}
	l.timer = time.AfterFunc(hold, func() { p.expire(key, l) })
	p.late[key] = append(p.late[key], l)
}

// expire hands l back unless a fetch took it.
func (p *pulls) expire(key string, l *late) {
	p.mu.Lock()
	kept := p.late[key]
	for i, k := range kept {
		if k == l {
			p.late[key] = append(kept[:i:i], kept[i+1:]...)
			if len(p.late[key]) == 0 {
				delete(p.late, key)
			}
			queue := p.queues[key]
			p.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
			defer cancel()
			p.handBack(ctx, queue, l.m)
			return
		}
	}
	p.mu.Unlock()
}

// handBack NAKs m, a late job of queue that no fetch took, once its record says that this
// delivery was not tried (unsent; not for a consumer this process never fetched from, whose
// queue it does not know). p.mu is not held: the record is a status read and write.
func (p *pulls) handBack(ctx context.Context, queue string, m *nats.Msg) {
	if p.unsent != nil && queue != "" {
		p.unsent(ctx, queue, m)
	}
	p.nak(m)
}

// takeLate returns up to limit late jobs of consumer key, oldest first.
func (p *pulls) takeLate(key string, limit int) []*nats.Msg {
	p.mu.Lock()
	defer p.mu.Unlock()
	kept := p.late[key]
	n := min(limit, len(kept))
	if n == 0 {
		return nil
	}
	out := make([]*nats.Msg, 0, n)
	for _, l := range kept[:n] {
		// A timer that fired already waits for p.mu in expire, which NAKs only the jobs
		// still kept: taken here, the job is this fetch's either way.
		l.timer.Stop()
		out = append(out, l.m)
	}
	p.late[key] = append(kept[:0:0], kept[n:]...)
	if len(p.late[key]) == 0 {
		delete(p.late, key)
	}
	return out
}

// stop unsubscribes and hands back the late jobs kept (Close), within opTimeout for their
// records all told: past it, they are NAK'd without.
func (p *pulls) stop() {
	type back struct {
		queue string
		m     *nats.Msg
	}
	var backs []back
	p.mu.Lock()
	p.closed = true
	for key, kept := range p.late {
		for _, l := range kept {
			l.timer.Stop()
			backs = append(backs, back{p.queues[key], l.m})
		}
		delete(p.late, key)
	}
	if p.sub != nil {
		_ = p.sub.Unsubscribe()
		p.sub = nil
	}
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	for _, b := range backs {
		p.handBack(ctx, b.queue, b.m)
	}
}

// nak hands m back for immediate redelivery. Without confirmation: were it lost, the job is
// redelivered after its AckWait, as before.
func (p *pulls) nak(m *nats.Msg) { _ = p.nc.Publish(m.Reply, []byte("-NAK")) }

// isJob reports whether m is a message of the stream rather than a status (nats.go's checkMsg).
func isJob(m *nats.Msg) bool {
	return len(m.Data) > 0 || len(m.Header) == 0 || m.Header.Get("Status") == ""
}

// pullStatus reads a status message: done ends the fetch (404 no messages, 408 expired), err
// is a failure; a heartbeat (100) is neither. The errors are nats.go's, as checkMsg maps them,
// so that fetchErr decides on them as before.
func pullStatus(m *nats.Msg) (done bool, err error) {
	descr := strings.ToLower(m.Header.Get("Description"))
	switch m.Header.Get("Status") {
	case "100":
		return false, nil
	case "404", "408":
		return true, nil
	case "400":
		return true, jetstream.ErrBadRequest
	case "503":
		return true, nats.ErrNoResponders
	case "409":
		switch {
		case strings.Contains(descr, "message size exceeds maxbytes"):
			return true, nil
		case strings.Contains(descr, "consumer deleted"):
			return true, jetstream.ErrConsumerDeleted
		case strings.Contains(descr, "leadership change"):
			return true, jetstream.ErrConsumerLeadershipChanged
		case strings.Contains(descr, "server shutdown"):
			return true, jetstream.ErrServerShutdown
		}
	}
	return true, fmt.Errorf("nats: %s", m.Header.Get("Description"))
}

// pullRequest is the body of a JetStream pull request ($JS.API.CONSUMER.MSG.NEXT).
type pullRequest struct {
	Batch     int   `json:"batch"`
	Expires   int64 `json:"expires,omitempty"`
	NoWait    bool  `json:"no_wait,omitempty"`
	Heartbeat int64 `json:"idle_heartbeat,omitempty"`
}

// pullFor is the request of a fetch of limit jobs: with no deadline on ctx, of the jobs
// available now; else one that expires before ctx does (nats.go's: 90% of the time left, at
// most 1 s less), with the heartbeat of longPull.
func pullFor(ctx context.Context, limit int, now time.Time) pullRequest {
	dl, ok := ctx.Deadline()
	if !ok {
		return pullRequest{Batch: limit, NoWait: true}
	}
	left := dl.Sub(now)
	r := pullRequest{Batch: limit, Expires: (left - min(left/10, time.Second)).Nanoseconds()}
	if hb := longPullHeartbeat(left); hb > 0 {
		r.Heartbeat = hb.Nanoseconds()
	}
	if r.Expires <= 0 {
		r.Expires, r.NoWait = 0, true
	}
	return r
}

// pullOnce sends one pull request for c and gathers its jobs: until limit came, the server
// ended it, ctx ended, or (no wait) noWaitGiveUp passed. It returns the jobs received and the
// failure that ended it, if any; a job that comes after it returned is late (pulls).
func (c *Consumer) pullOnce(ctx context.Context, limit int, noWait bool) ([]*nats.Msg, error) {
	var req pullRequest
	if noWait {
		req = pullRequest{Batch: limit, NoWait: true}
	} else {
		req = pullFor(ctx, limit, time.Now())
	}
	body, _ := json.Marshal(req)
	pl, reply, err := c.q.pulls.start(c.q.nc, c.key, c.queue, c.ackWait, limit, !noWait)
	if err != nil {
		return nil, err
	}
	defer c.q.pulls.end(reply, pl)
	if err := c.q.nc.PublishRequest(c.next, reply, body); err != nil {
		return nil, err
	}
	var giveUp <-chan time.Time
	if noWait {
		t := time.NewTimer(noWaitGiveUp)
		defer t.Stop()
		giveUp = t.C
	}
	var out []*nats.Msg
	for len(out) < limit {
		select {
		case m := <-pl.ch:
			if isJob(m) {
				out = append(out, m)
				continue
			}
			if done, err := pullStatus(m); done {
				return out, err
			}
		case <-giveUp:
			return out, nil
		case <-ctx.Done():
			return out, ctx.Err()
		}
	}
	return out, nil
}

// pulled is a job received on the fetch path's subscription, as a jetstream.Msg: nats.go has
// no exported way to make one from a *nats.Msg. Its acknowledgements are nats.go's (the same
// bodies, to the same reply subject); it refuses a second Ack, Nak or Term as nats.go does.
type pulled struct {
	m    *nats.Msg
	nc   *nats.Conn
	ackd atomic.Bool
}

var _ jetstream.Msg = (*pulled)(nil)

func (p *pulled) Metadata() (*jetstream.MsgMetadata, error) {
	md, err := p.m.Metadata()
	if err != nil {
		return nil, err
	}
	return &jetstream.MsgMetadata{
		Sequence:     jetstream.SequencePair{Consumer: md.Sequence.Consumer, Stream: md.Sequence.Stream},
		NumDelivered: md.NumDelivered, NumPending: md.NumPending, Timestamp: md.Timestamp,
		Stream: md.Stream, Consumer: md.Consumer, Domain: md.Domain,
	}, nil
}

func (p *pulled) Data() []byte         { return p.m.Data }
func (p *pulled) Headers() nats.Header { return p.m.Header }
func (p *pulled) Subject() string      { return p.m.Subject }
func (p *pulled) Reply() string        { return p.m.Reply }

func (p *pulled) Ack() error { return p.publish("+ACK") }

func (p *pulled) DoubleAck(ctx context.Context) error {
	return p.ack("+ACK", func(body []byte) error {
		_, err := p.nc.RequestWithContext(ctx, p.m.Reply, body)
		return err
	})
}

func (p *pulled) Nak() error { return p.publish("-NAK") }

func (p *pulled) NakWithDelay(d time.Duration) error {
	if d <= 0 {
		return p.Nak()
	}
	return p.publish(fmt.Sprintf(`-NAK {"delay": %d}`, d.Nanoseconds()))
}

func (p *pulled) InProgress() error {
	if p.ackd.Load() {
		return jetstream.ErrMsgAlreadyAckd
	}
	return p.nc.Publish(p.m.Reply, []byte("+WPI"))
}

func (p *pulled) Term() error { return p.publish("+TERM") }

func (p *pulled) TermWithReason(reason string) error { return p.publish("+TERM " + reason) }

// publish sends the acknowledgement body without waiting for the server.
func (p *pulled) publish(body string) error {
	return p.ack(body, func(body []byte) error { return p.nc.Publish(p.m.Reply, body) })
}

// ack sends body by send, once: a second acknowledgement is refused, as nats.go does.
func (p *pulled) ack(body string, send func([]byte) error) error {
	if p.m.Reply == "" {
		return jetstream.ErrMsgNoReply
	}
	if p.ackd.Load() {
		return jetstream.ErrMsgAlreadyAckd
	}
	if err := send([]byte(body)); err != nil {
		return err
	}
	p.ackd.Store(true)
	return nil
}
