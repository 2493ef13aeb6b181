package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// Objects on demand. Most queues never have a scheduled job or a dead letter, and their
// schedule and dead-letter streams (with the movers' long pulls) would cost nats-server on
// every start and while idle (docs/design/queue.md). So a queue's schedule stream and mover
// are made by its first scheduled publish, and its dead-letter stream by its first dead
// letter, once per process (the set of those known to exist is kept), idempotently (processes
// that race all succeed: creating a stream as it already is changes nothing). Provision lists
// each kind once (a paged listing, not a request per queue) and updates those that exist to
// the current settings. A reader treats a missing stream as empty: 0 scheduled, no dead
// letters.

// onDemand makes sure the object of queue name that known tracks exists, calling make the
// first time this process needs it. One make runs at a time in a process (q.making), so that
// a burst of first uses does not send the same creations many times; a caller gives up
// waiting for it when ctx ends.
func (q *core) onDemand(ctx context.Context, known *sync.Map, name string, make func(context.Context) error) error {
	return onDemandIn(ctx, q.making, known, name, make)
}

// onDemandIn is onDemand with as many makes at a time as slots has room for. Two makes of the
// same object may then run at once; each must be idempotent.
func onDemandIn(ctx context.Context, slots chan struct{}, known *sync.Map, name string, make func(context.Context) error) error {
	if _, ok := known.Load(name); ok {
		return nil
	}
	select {
	case slots <- struct{}{}:
		defer func() { <-slots }()
	case <-ctx.Done():
		return fmt.Errorf("queue: %q: %w", name, ctx.Err())
	}
	if _, ok := known.Load(name); ok {
		return nil
	}
	if err := make(ctx); err != nil {
		return err
	}
	known.Store(name, struct{}{})
	return nil
}

// existing is what Provision finds on the server, by queue name: the queues whose delivery
// stream, admission ledger, schedule stream, dead-letter stream or tenants' backlog stream
// exists.
type existing struct {
	queues, ledgers, schedules, deadLetters, backlogs map[string]bool
	shared                                            bool // a shared stream exists
}

// listExisting lists the streams of this prefix by name: one paged listing (a page holds
// 1 024 names) instead of a lookup per queue and kind. What it finds missing Provision creates
// without looking first: on a fresh server every lookup would be answered "not found", and
// nats-server answers lookups only when no creation waits (its info requests are queued
// behind the others), so they stalled the creations of processes starting together.
func (q *core) listExisting(ctx context.Context) (existing, error) {
	ex := existing{queues: map[string]bool{}, ledgers: map[string]bool{}, schedules: map[string]bool{},
		deadLetters: map[string]bool{}, backlogs: map[string]bool{}}
	kinds := []struct {
		prefix string
		found  map[string]bool
	}{
		{q.streamName(""), ex.queues}, {q.ledgerName(""), ex.ledgers}, {q.schedStreamPrefix(), ex.schedules},
		{q.dlqStreamName(""), ex.deadLetters}, {q.backlogStreamName(""), ex.backlogs},
	}
	l := q.js.StreamNames(ctx, jetstream.WithStreamListSubject(q.opts.Prefix+".>"))
	for name := range l.Name() {
		if strings.HasPrefix(name, q.opts.Prefix+"_J_") {
			ex.shared = true
		}
		for _, k := range kinds {
			if queue, ok := strings.CutPrefix(name, k.prefix); ok {
				k.found[queue] = true
				break
			}
		}
	}
	if err := l.Err(); err != nil {
		return ex, fmt.Errorf("queue: list streams: %w", err)
	}
	return ex, nil
}

// noStream reports whether err says that a stream does not exist.
func noStream(err error) bool { return errors.Is(err, jetstream.ErrStreamNotFound) }
