package worker

import (
	"context"
	"time"

	"github.com/sluice-rl/sluice/queue"
)

// Repairing the admission ledgers (queue.Deliveries.SweepLedger). A ticket is released after
// its job's acknowledgement; a worker that dies in between leaves a ticket that counts against
// its queue's max_depth and tenant_max_depth though its job is gone. Every worker sweeps its
// queues' ledgers now and then, a page of tickets at a time, each sweep resuming where the last
// one stopped: a leaked ticket comes back within a few sweeps of ledgerSweepEvery. The rules'
// deferral budgets are swept too, the first page of each.

const (
	// ledgerSweepEvery is how often a worker sweeps one page of each queue's ledger.
	ledgerSweepEvery = 2 * time.Minute
	// ledgerSweepPage is how many tickets one sweep reads per queue: each costs a status read.
	ledgerSweepPage = 500
	// ledgerSweepAge is how old a ticket must be to be swept: far beyond any publish's time
	// between its ticket and its job.
	ledgerSweepAge = 10 * time.Minute
)

// ledgerSweeper is the queue layer's repair of the ledgers; *queue.Queues has it.
type ledgerSweeper interface {
	SweepLedger(ctx context.Context, name string, from uint64, olderThan time.Duration, limit int) (removed int, next uint64, err error)
	SweepBudgets(ctx context.Context, olderThan time.Duration, limit int) (int, error)
}

var _ ledgerSweeper = (*queue.Queues)(nil)

// ledgerLister lists the ledgers that exist with their tickets (queue.Deliveries.Ledgers).
type ledgerLister interface {
	Ledgers(ctx context.Context) (map[string]uint64, error)
}

// sweepLedgers sweeps the ledgers of the Pool's queues every ledgerSweepEvery until ctx ends.
// A Broker without SweepLedger (a test's fake) is not swept.
func (p *Pool) sweepLedgers(ctx context.Context) {
	sw, ok := p.q.(ledgerSweeper)
	if !ok {
		return
	}
	from := map[string]uint64{}
	t := time.NewTicker(ledgerSweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Only the ledgers that hold tickets, where the broker can list them: a queue whose
		// ledger was never made (most, with thousands of queues) costs the sweep nothing.
		var held map[string]uint64
		if l, ok := p.q.(ledgerLister); ok {
			held, _ = l.Ledgers(ctx)
		}
		for _, s := range p.Queues() {
			if held != nil && held[s.Name] == 0 {
				from[s.Name] = 0
				continue
			}
			removed, next, err := sw.SweepLedger(ctx, s.Name, from[s.Name], ledgerSweepAge, ledgerSweepPage)
			from[s.Name] = next
			switch {
			case err != nil && ctx.Err() == nil:
				p.log.Debug("worker: sweep the admission ledger", "queue", s.Name, "err", err)
			case removed > 0:
				p.log.Info("worker: released tickets whose jobs had left", "queue", s.Name, "tickets", removed)
			}
		}
		removed, err := sw.SweepBudgets(ctx, ledgerSweepAge, ledgerSweepPage)
		switch {
		case err != nil && ctx.Err() == nil:
			p.log.Debug("worker: sweep the deferral budgets", "err", err)
		case removed > 0:
			p.log.Info("worker: released deferral budget tickets whose jobs had left", "tickets", removed)
		}
	}
}
