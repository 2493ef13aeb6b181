package app

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/queue"
)

// Removing leftovers (queue.Deliveries.RemoveLeftovers): jobs acked while their stream could
// not write (a full disk under nats-server) stay in the stream, and would be counted in the
// queue's depth (the history, KEDA's input) forever; a job whose final status was recorded by
// a worker that crashed, or lost its connection, before its ack counts until its ack_wait runs
// out. The process that runs workers removes them, leftoverPage jobs in flight per queue a
// pass: every second for leftoverAfterReconnect after each reconnection to NATS (the stream
// writes again once nats-server was restarted; the workers' outboxes write the records of the
// deliveries the outage cut short), every leftoverEvery otherwise, and after a failed pass
// again 1 s later, then 2 s, 4 s... The admin API's queue reads remove those they find
// themselves (queue.Info).
const (
	// leftoverEvery is the time between two passes while nothing happened: each costs two
	// reads per queue, and two per job delivered and not acked (up to leftoverPage).
	leftoverEvery = 30 * time.Second
	// leftoverRetry is the time between two passes after a reconnection, and the wait after
	// the first failed pass; it doubles with each failed pass after that.
	leftoverRetry = time.Second
	// leftoverAfterReconnect is how long passes run every leftoverRetry after a reconnection:
	// longer than the 5 s a final record must be old for its job to be a leftover, so that the
	// records the outboxes write just after the reconnection are old enough before it ends.
	leftoverAfterReconnect = 10 * time.Second
	// leftoverPage is how many jobs delivered and not acked a pass reads per queue, each
	// pass going on from where the last stopped: each costs a message and a status read.
	leftoverPage = 100
)

// leftoverRemover is the queue layer's removal of leftovers; *queue.Queues has it.
type leftoverRemover interface {
	RemoveLeftovers(ctx context.Context, name string, from uint64, limit int) (removed int, next uint64, err error)
}

// sharedLeftoverRemover is the queue layer's removal of the shared streams' leftovers, one
// pass over them all; *queue.Queues has it.
type sharedLeftoverRemover interface {
	RemoveSharedLeftovers(ctx context.Context, from map[string]uint64, limit int) (map[string]int, error)
}

var (
	_ leftoverRemover       = (*queue.Queues)(nil)
	_ sharedLeftoverRemover = (*queue.Queues)(nil)
)

// removeLeftovers runs passes over the queues of cfg() on q until ctx ends (see above); nc
// (nil: none) is the connection whose reconnections start a pass, fix what to do about a
// stream that cannot write (fixRestart, or the embedded server's own recovery).
func removeLeftovers(ctx context.Context, q leftoverRemover, nc *nats.Conn, cfg func() *config.Config, fix string, log *slog.Logger) error {
	reconnects := func() uint64 {
		if nc == nil {
			return 0
		}
		return nc.Stats().Reconnects
	}
	t := time.NewTicker(leftoverRetry)
	defer t.Stop()
	seen, wait, next := reconnects(), leftoverRetry/2, time.Now()
	var quick time.Time         // passes run every leftoverRetry until then
	from := map[string]uint64{} // by queue: where the next pass goes on
	stuck := map[string]bool{}  // by queue: its stream said it cannot write
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		now := time.Now()
		if n := reconnects(); n != seen {
			seen, wait, next, quick = n, leftoverRetry/2, now, now.Add(leftoverAfterReconnect)
		}
		if now.Before(next) {
			continue
		}
		switch {
		case !removeLeftoversOnce(ctx, q, cfg(), from, stuck, fix, log):
			wait = min(2*wait, leftoverEvery)
		case now.Before(quick):
			wait = leftoverRetry
		default:
			wait = leftoverEvery
		}
		next = time.Now().Add(wait)
	}
}

// removeLeftoversOnce is one pass over the queues of cfg, each from where from says and
// recording there where the next goes on; it reports whether it read every queue. A queue
// whose stream answers that it cannot write is logged once, with fix (what to do), and noted in
// stuck until a pass succeeds.
func removeLeftoversOnce(ctx context.Context, q leftoverRemover, cfg *config.Config, from map[string]uint64, stuck map[string]bool, fix string, log *slog.Logger) bool {
	ok := true
	for _, qc := range cfg.Queues {
		n, next, err := q.RemoveLeftovers(ctx, qc.Name, from[qc.Name], leftoverPage)
		from[qc.Name] = next
		switch {
		case errors.Is(err, queue.ErrUnknownQueue): // not provisioned yet
		case err != nil:
			ok = false
			switch {
			case ctx.Err() != nil:
			case strings.Contains(err.Error(), "no space left on device") && !stuck[qc.Name]:
				stuck[qc.Name] = true
				log.Error("the queue's stream cannot write (its store failed: no space left on device): its jobs are "+
					"still delivered but stay in the stream, and deferrals to it answer 503; "+fix, "queue", qc.Name, "err", err)
			default:
				log.Debug("remove the leftovers of a queue", "queue", qc.Name, "err", err)
			}
		case n > 0:
			log.Warn("removed jobs from their stream that had left the queue (acked while the stream could not write, or final with their ack lost); they were not waiting",
				"queue", qc.Name, "jobs", n)
		}
		if err == nil && stuck[qc.Name] {
			delete(stuck, qc.Name)
			log.Info("the queue's stream writes again", "queue", qc.Name)
		}
	}
	if sq, is := q.(sharedLeftoverRemover); is {
		// The shared streams' queues, in one pass (from keys them "<stream>/<queue>").
		removed, err := sq.RemoveSharedLeftovers(ctx, from, leftoverPage)
		for name, n := range removed {
			log.Warn("removed jobs from their shared stream that had left the queue (acked while the stream could not write, or final with their ack lost); they were not waiting",
				"queue", name, "jobs", n)
		}
		if err != nil {
			ok = false
			if ctx.Err() == nil {
				log.Debug("remove the leftovers of the shared streams", "err", err)
			}
		}
	}
	return ok
}
