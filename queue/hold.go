package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Release by acknowledgement: the hold consumer.
//
// Model. Every ledger (a queue's <prefix>_L_<queue>, a deferral budget's <prefix>_KW_<token>)
// is a work-queue stream with one durable push consumer, "hold", that never acknowledges:
// AckExplicit, an AckWait of ten years (no redelivery in practice), no bound on acks pending,
// delivered to <prefix>.hold in the queue group "hold", where every process that consumes a
// queue has one subscription, made with its first consumer on a connection of its own
// (subscribeHold), that drops what it receives. So
// while a worker runs, each ticket is pending in its ledger's hold consumer soon after it is
// stored; tickets stored while none runs wait undelivered (costing intake no delivery) and
// are delivered, oldest first, when one subscribes. When a job leaves through a worker
// (acked, dead-lettered), its tickets are released by publishing, for each, the consumer's
// acknowledgement of the ticket's stream sequence ($JS.ACK.<stream>.hold.1.<seq>.0.0.0; the
// server looks the sequence up among the consumer's pending and uses its own delivery
// sequence) with a reply subject (release.go: one subscription takes every answer): the server
// removes the ticket from the work-queue stream and then answers (in a cluster, once the
// acknowledgement is replicated).
//
// Guarantees. A ticket still leaves only after its job's acknowledgement, and an
// acknowledgement names one stream sequence, which the stream never reuses: a repeated release
// removes nothing else. The server ignores, without an answer, an acknowledgement of a ticket
// its hold consumer has not delivered yet (no process subscribed, the consumer missing, the
// delivery behind): when no answer comes within holdWait, nor to a second try (the catch-up
// after a worker's start may have reached the ticket by then), the release falls back to deleting
// the ticket (a JetStream API request), as before the hold consumer; a deletion of a pending
// ticket also drops it from the consumer's pending. Refusals, Cancel and jobs not stored
// after all release by deletion: their tickets are seldom delivered yet.
//
// Costs. nats-server spends ~6 µs of CPU on an acknowledgement that removes a work-queue
// message, where a deletion costs ~30 µs; the hold consumer adds one delivery per ticket (a
// message out, to one worker, which drops it; a ticket's body is its job's id, and headers
// only would cost the server a copy of each; none while no worker runs, the backlog's at the
// first worker's start) and keeps one pending entry per ticket delivered,
// which its state on disk writes at most 10 times a second while it changes (O(tickets held)
// each). A ledger costs one more request when it is made (the consumer); a Provision that
// finds it with a consumer and the stamp of the current hold settings in its metadata sends
// none, and one without the stamp brings the hold to them (ensureHoldAs: three requests, once).
// The sweep reads a ledger with one batched direct get per page (a work-queue stream admits no
// second consumer), on the JetStream context's API prefix (APIPrefix).

// holdName is the durable name of every ledger's hold consumer and its delivery's queue group.
const holdName = "hold"

// holdAckWait is the hold consumer's AckWait: a ticket is held, undelivered again, this long.
const holdAckWait = 10 * 365 * 24 * time.Hour

// defaultHoldWait bounds the wait for the answer to a release by acknowledgement before it
// falls back to deletion.
const defaultHoldWait = 2 * time.Second

// holdFlush bounds the wait for the server to have a new hold subscription (subscribeHold); a
// server that does not answer within it gets the subscription when it can.
const holdFlush = 2 * time.Second

func (q *core) holdSubject() string { return q.opts.Prefix + ".hold" }

// isHeld reports whether ledger stream name is one with a hold consumer (not a limits ledger
// from before it).
func (q *core) isHeld(name string) bool {
	return strings.HasPrefix(name, q.ledgerName("")) || strings.HasPrefix(name, q.budgetStreams())
}

// holdConfig is the hold consumer of every ledger.
func (q *core) holdConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        holdName,
		Description:    "Sluice: holds each ticket until its job's release acknowledges it",
		DeliverSubject: q.holdSubject(),
		DeliverGroup:   holdName,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        holdAckWait,
		MaxDeliver:     -1,
		MaxAckPending:  -1,
	}
}

// backlogHoldConfig is the hold consumer of a fair queue's backlog stream: holdConfig, with
// each job's headers only (its envelope, without its body) delivered to the holds.
func (q *core) backlogHoldConfig() jetstream.ConsumerConfig {
	cfg := q.holdConfig()
	cfg.Description = "Sluice: holds each backlog job until the fair scheduler's move acknowledges it"
	cfg.HeadersOnly = true
	return cfg
}

// ensureHold makes the hold consumer of ledger st, or brings the one it has to holdConfig
// (ensureHoldAs).
func (q *core) ensureHold(ctx context.Context, st jetstream.Stream) error {
	return q.ensureHoldAs(ctx, st, q.holdConfig())
}

// holdStampKey is the key, in a ledger's or a backlog's stream metadata, of the stamp of the
// settings its hold consumer was made with or brought to (holdStamp).
const holdStampKey = "sluice_hold"

// holdStamp is a digest of hold consumer cfg's settings.
func holdStamp(cfg jetstream.ConsumerConfig) string {
	h := fnv.New64a()
	fmt.Fprintf(h, "%q %q %q %d %d %d %d %d %t", cfg.Description, cfg.DeliverSubject, cfg.DeliverGroup,
		cfg.DeliverPolicy, cfg.AckPolicy, cfg.AckWait, cfg.MaxDeliver, cfg.MaxAckPending, cfg.HeadersOnly)
	return strconv.FormatUint(h.Sum64(), 36)
}

// withHoldStamp is stream cfg (a ledger's or a backlog's) stamped with hold consumer hc: the
// stream it creates gets its hold from ensureHoldAs, at hc. An update of an existing stream
// (ensureStream) keeps the stamp the stream has.
func withHoldStamp(cfg jetstream.StreamConfig, hc jetstream.ConsumerConfig) jetstream.StreamConfig {
	cfg.Metadata = map[string]string{holdStampKey: holdStamp(hc)}
	return cfg
}

// ensureHoldAs makes hold consumer cfg on st (a ledger or a backlog) when st's info counts no
// consumer (the hold is the only one either has); when it counts one and st's metadata lacks
// cfg's stamp (a hold made by an earlier version, or with other settings), it brings the hold
// to cfg (updateHold) and then stamps st. So a Provision that finds a stamped stream sends no
// request for its hold; each ledger is looked at (its hold's info, an update where it
// differs, the stream's stamp) once after an upgrade that changes the settings.
func (q *core) ensureHoldAs(ctx context.Context, st jetstream.Stream, cfg jetstream.ConsumerConfig) error {
	info := st.CachedInfo()
	if info == nil {
		return nil
	}
	stamp := holdStamp(cfg)
	if info.State.Consumers == 0 {
		_, err := q.js.CreatePushConsumer(ctx, info.Config.Name, cfg)
		if err == nil {
			q.stampHold(ctx, info.Config, stamp)
			return nil
		}
		if !errors.Is(err, jetstream.ErrConsumerExists) {
			return fmt.Errorf("hold consumer: %w", classify(err))
		}
		// Another process made it first, maybe with the settings of its version.
	} else if info.Config.Metadata[holdStampKey] == stamp {
		return nil
	}
	if err := q.updateHold(ctx, info.Config.Name, cfg); err != nil {
		return fmt.Errorf("hold consumer: %w", err)
	}
	q.stampHold(ctx, info.Config, stamp)
	return nil
}

// updateHold brings the hold consumer of stream to cfg where JetStream allows a change: its
// description, AckWait, MaxDeliver, MaxAckPending, HeadersOnly and delivery group, set on top
// of the settings it has. JetStream refuses a change of a consumer's deliver policy, ack
// policy, replay policy, flow control and heartbeats, of pull to push, and of a push
// consumer's delivery subject while a process is subscribed to it: a hold keeps those as they
// are (deleting it makes the next Provision create it anew: its tickets are then delivered
// again, in the catch-up). A stream whose one consumer is not named hold gets one.
func (q *core) updateHold(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) error {
	c, err := q.js.PushConsumer(ctx, stream, holdName)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		_, err = q.js.CreatePushConsumer(ctx, stream, cfg)
		if errors.Is(err, jetstream.ErrConsumerExists) {
			return nil
		}
		return classify(err)
	case errors.Is(err, jetstream.ErrNotPushConsumer):
		return nil // JetStream turns no pull consumer into a push one
	case err != nil:
		return err
	}
	have := c.CachedInfo().Config
	want := have
	want.Description, want.AckWait, want.MaxDeliver = cfg.Description, cfg.AckWait, cfg.MaxDeliver
	want.MaxAckPending, want.HeadersOnly, want.DeliverGroup = cfg.MaxAckPending, cfg.HeadersOnly, cfg.DeliverGroup
	if want.Description == have.Description && want.AckWait == have.AckWait && want.MaxDeliver == have.MaxDeliver &&
		want.MaxAckPending == have.MaxAckPending && want.HeadersOnly == have.HeadersOnly && want.DeliverGroup == have.DeliverGroup {
		return nil
	}
	_, err = q.js.UpdatePushConsumer(ctx, stream, want)
	return classify(err)
}

// stampHold stamps stream cfg's metadata with stamp, unless it has it: one stream update. A
// failure is left alone: the next Provision looks at the hold again.
func (q *core) stampHold(ctx context.Context, cfg jetstream.StreamConfig, stamp string) {
	if cfg.Metadata[holdStampKey] == stamp {
		return
	}
	cfg.Metadata = maps.Clone(cfg.Metadata)
	if cfg.Metadata == nil {
		cfg.Metadata = map[string]string{}
	}
	cfg.Metadata[holdStampKey] = stamp
	_, _ = q.js.UpdateStream(ctx, cfg)
}

// subscribeHold subscribes this process to the hold consumers' deliveries, which it drops,
// unless it is already subscribed. The first consumer a process opens (Consumer,
// LevelConsumer, FormerConsumer) and a fair queue's layout (FairLayout, for its scheduler)
// call it: the processes that acknowledge jobs, whose releases need their tickets (or
// backlog jobs) delivered, receive the deliveries; a process that only
// publishes (an ingress without in-process workers) does not, and while no worker runs the
// server delivers no ticket at all, so intake pays no delivery and the holds' state stays
// empty. A ledger's tickets stored meanwhile are delivered once a worker subscribes, from
// the oldest on, all at once: the catch-up.
//
// The subscription is on a connection of its own (holdConnect), not the one the process
// fetches, records and acknowledges on: a catch-up of N tickets is N messages that one
// connection reads in order, and on the process's connection every reply behind them (the
// first fetches' jobs, the status writes', the releases' answers) waited until they were
// read. A fresh worker that subscribed first on a backlog of 20 000 jobs stood still for the
// 40–130 ms of its catch-up (docs/design/worker-costs.md, "A fresh worker's start"). Where
// the second connection cannot be made, the process's own is used, as before.
func (q *core) subscribeHold() error {
	q.holdMu.Lock()
	defer q.holdMu.Unlock()
	if q.holdSub != nil || q.holdDropped {
		return nil
	}
	nc := q.holdConnect()
	sub, err := nc.QueueSubscribe(q.holdSubject(), holdName, func(*nats.Msg) {
	})
	if err != nil {
		if nc != q.nc {
			nc.Close()
		}
		return fmt.Errorf("queue: subscribe %s: %w", q.holdSubject(), err)
	}
	// Dropped deliveries cost nothing: a slow process loses some of them, not its connection.
	_ = sub.SetPendingLimits(1<<20, 64<<20)
	if nc != q.nc {
		// The server has the subscription before this returns, as it had when it came first on
		// the process's connection, ahead of the fetches and acknowledgements that follow: a
		// release or a fair move right after it finds the catch-up under way, not yet to start.
		_ = nc.FlushTimeout(holdFlush)
	}
	q.holdSub, q.holdConn = sub, nc
	return nil
}

// holdConnect returns a new connection for the hold deliveries: the process's connection's
// options (servers, credentials, TLS, reconnection) under the name "<name> holds", without
// its handlers (a deployment's disconnect and error logs are about the process's connection;
// this one only drops messages, and a delivery it misses costs nothing: the ticket is pending
// in its hold from the moment the server sent it). It returns the process's connection when
// the new one cannot be made.
func (q *core) holdConnect() *nats.Conn {
	o := q.nc.Opts
	o.Name = strings.TrimSpace(o.Name + " holds")
	o.ClosedCB, o.DisconnectedCB, o.DisconnectedErrCB, o.ConnectedCB = nil, nil, nil, nil
	o.ReconnectedCB, o.DiscoveredServersCB, o.ReconnectErrCB, o.LameDuckModeHandler = nil, nil, nil, nil
	o.AsyncErrorCB = func(*nats.Conn, *nats.Subscription, error) {} // not nats.go's default, which logs
	hc, err := o.Connect()
	if err != nil {
		return q.nc
	}
	// It ends with the process's connection, as a subscription on that one did.
	mainClosed, closed := q.nc.StatusChanged(nats.CLOSED), hc.StatusChanged(nats.CLOSED)
	go func() {
		if !q.nc.IsClosed() {
			select {
			case <-mainClosed:
			case <-closed:
			}
		}
		q.nc.RemoveStatusListener(mainClosed)
		hc.Close()
	}()
	return hc
}

// unsubscribeHold ends this process's subscription to the hold consumers' deliveries, if any,
// and closes its connection.
func (q *core) unsubscribeHold() {
	q.holdMu.Lock()
	defer q.holdMu.Unlock()
	if q.holdSub != nil {
		_ = q.holdSub.Unsubscribe()
		if q.holdConn != q.nc {
			q.holdConn.Close()
		}
		q.holdSub, q.holdConn = nil, nil
	}
}

// releaseAcked releases tickets ts of a job a worker acknowledged or dead-lettered, in the
// background: those of a held ledger by its hold consumer's acknowledgement, published now
// and answered on the releaser's subscription (release.go), the others (a limits ledger's) by
// deletion. Close waits for them.
func (q *core) releaseAcked(ts []ticket) {
	var held, rest []ticket
	for _, t := range ts {
		if q.isHeld(t.stream) {
			held = append(held, t)
		} else {
			rest = append(rest, t)
		}
	}
	if len(held) > 0 {
		q.releases.Add(len(held))
		go q.releaser.send(held)
	}
	q.releaseLater(rest)
}

// heldTicket is a ticket as the sweep reads it: its sequence, when it was stored, its job.
type heldTicket struct {
	seq    uint64
	stored time.Time
	job    string
}

// readTickets reads up to limit tickets of ledger stream from sequence from on, in order, in
// one batched direct get (nats-server ≥ 2.11; the ledger allows direct gets), on js's API
// prefix (APIPrefix).
func (q *core) readTickets(ctx context.Context, stream string, from uint64, limit int) ([]heldTicket, error) {
	inbox := q.nc.NewRespInbox()
	ch := make(chan *nats.Msg, limit+1)
	sub, err := q.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe() //nolint:errcheck // the inbox is this call's alone
	req, err := json.Marshal(struct {
		Seq   uint64 `json:"seq"`
		Batch int    `json:"batch"`
	}{from, limit})
	if err != nil {
		return nil, err
	}
	if err := q.nc.PublishRequest(q.api+"DIRECT.GET."+stream, inbox, req); err != nil {
		return nil, err
	}
	var out []heldTicket
	for {
		var m *nats.Msg
		select {
		case m = <-ch:
		case <-ctx.Done():
			return out, ctx.Err()
		}
		switch status := m.Header.Get("Status"); status {
		case "":
		case "204", "404": // end of batch; nothing from `from` on
			return out, nil
		default:
			return out, fmt.Errorf("read ledger %s: %s %s", stream, status, m.Header.Get("Description"))
		}
		seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			continue
		}
		stored, _ := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
		out = append(out, heldTicket{seq: seq, stored: stored, job: string(m.Data)})
	}
}

// ReleaseFallbacks is how many releases by acknowledgement this process sent that got no
// answer within their wait, twice, and deleted the ticket instead (the ticket not delivered
// to its hold: the hold consumer missing, its delivery far behind, the server gone). Workers export it as sluice_ticket_release_fallbacks_total.
func (d Deliveries) ReleaseFallbacks() uint64 { return d.releaseFallbacks.Load() }
