package queue

import (
	"context"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
)

// Reconnects returns how many times the connection to NATS has reconnected since it was made.
// A worker that sees it change knows the server may have restarted, and with it forgotten the
// delivery counts of recently acknowledged jobs (see the worker's recall).
func (q *Queues) Reconnects() uint64 { return q.nc.Stats().Reconnects }

// Connected reports whether the connection to NATS is up now.
func (q *Queues) Connected() bool { return q.nc.IsConnected() }

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

// connWatch holds a context that ends when the connection to NATS is lost, and a new one for
// each connection after it. Publishes, status reads and writes and confirmed acks run under it
// (whileConnected): a request in flight when the server crashed has lost its reply with the
// connection, and waiting for its deadline (Options.PublishTimeout, 2 s; 5 s for the others)
// would only delay the answer that nothing was stored, or keep a worker's status record out of
// its outbox while another worker reads the job's record. nats.go fails pending async
// publishes on a reconnect by itself, but not requests.
type connWatch struct {
	mu     sync.Mutex
	ctx    context.Context
	cancel context.CancelFunc
	events chan nats.Status
}

// watch starts following nc's status; it stops when nc is closed or stop is called.
func (w *connWatch) watch(nc *nats.Conn) {
	w.mu.Lock()
	w.events = nc.StatusChanged(nats.CONNECTED, nats.RECONNECTING, nats.DISCONNECTED, nats.CLOSED)
	w.ctx, w.cancel = context.WithCancel(context.Background())
	if !nc.IsConnected() {
		w.cancel()
	}
	events := w.events
	w.mu.Unlock()
	go func() {
		for s := range events {
			w.mu.Lock()
			if s == nats.CONNECTED {
				if w.ctx.Err() != nil {
					w.ctx, w.cancel = context.WithCancel(context.Background())
				}
			} else {
				w.cancel()
			}
			w.mu.Unlock()
			if s == nats.CLOSED {
				return
			}
		}
	}()
}

// stop stops following the connection's status.
func (w *connWatch) stop(nc *nats.Conn) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.events != nil {
		nc.RemoveStatusListener(w.events)
		w.cancel()
	}
}

// whileConnected returns ctx, also ended when the current connection is lost.
func (q *core) whileConnected(ctx context.Context) (context.Context, context.CancelFunc) {
	q.conn.mu.Lock()
	conn := q.conn.ctx
	q.conn.mu.Unlock()
	if conn == nil { // a Queues made by New always has one
		return context.WithCancel(ctx)
	}
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(conn, cancel)
	return ctx, func() { stop(); cancel() }
}
