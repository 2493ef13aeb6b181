package queue

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
)

// Reconnects returns how many times the connection to NATS has reconnected since it was made.
// A worker that sees it change knows the server may have restarted, and with it forgotten the
// delivery counts of recently acknowledged jobs (see the worker's recall).
func (q *Queues) Reconnects() uint64 { return q.nc.Stats().Reconnects }

// leaderElected is the subject of JetStream's advisories that a consumer elected a leader.
const leaderElected = "$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.>"

// WatchLeaders calls fn whenever a consumer of this account elects a new leader (in a NATS
// cluster, after its leader failed or stepped down), until ctx ends. Pull requests waiting at
// the old leader are gone with it: a worker holding long pulls makes them again.
func (q *Queues) WatchLeaders(ctx context.Context, fn func()) error {
	sub, err := q.nc.Subscribe(leaderElected, func(*nats.Msg) { fn() })
	if err != nil {
		return fmt.Errorf("queue: watch consumer leaders: %w", err)
	}
	<-ctx.Done()
	return sub.Unsubscribe()
}
