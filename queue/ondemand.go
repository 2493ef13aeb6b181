package queue

import (
	"context"
	"errors"
	"fmt"
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
	if _, ok := known.Load(name); ok {
		return nil
	}
	select {
	case q.making <- struct{}{}:
		defer func() { <-q.making }()
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

// existing is what Provision finds made on demand: the queues that have a schedule stream
// and those that have a dead-letter stream, by name.
type existing struct{ schedules, deadLetters, backlogs map[string]bool }

// listExisting lists the schedule, dead-letter and backlog streams of this prefix: three paged
// listings.
func (q *core) listExisting(ctx context.Context) (existing, error) {
	ex := existing{schedules: map[string]bool{}, deadLetters: map[string]bool{}, backlogs: map[string]bool{}}
	err := q.listStreams(ctx, q.opts.Prefix+".s.>", q.schedStreamPrefix(), func(name string, _ jetstream.StreamState) {
		ex.schedules[name] = true
	})
	if err != nil {
		return ex, err
	}
	err = q.listStreams(ctx, q.opts.Prefix+".dlq.>", q.dlqStreamName(""), func(name string, _ jetstream.StreamState) {
		ex.deadLetters[name] = true
	})
	if err != nil {
		return ex, err
	}
	err = q.listStreams(ctx, q.opts.Prefix+".t.>", q.opts.Prefix+"_T_", func(name string, _ jetstream.StreamState) {
		ex.backlogs[name] = true
	})
	return ex, err
}

// noStream reports whether err says that a stream does not exist.
func noStream(err error) bool { return errors.Is(err, jetstream.ErrStreamNotFound) }
