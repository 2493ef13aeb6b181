package fair

import (
	"math"
	"time"
)

// unseenFor is how long a job the scheduler moved counts as waiting in the delivery stream
// whatever the consumer says. The consumer's count catches up within a moment; the bound keeps
// a moved job that was deleted there before its delivery (canceled) from holding a place in
// the lookahead for longer.
const unseenFor = 100 * time.Millisecond

// ahead are the jobs the leader moved to the delivery stream that the consumer has not
// delivered yet, as far as it knows: their delivery-stream sequences, costs and when they were
// moved. The server acknowledges a publish before it tells the stream's consumers of the new
// message, so a consumer's pending count read right after a move can miss the jobs just moved,
// and a round that trusted it would move a whole lookahead more. Those of the moved jobs the
// consumer has not delivered yet (sequences above its delivered stream sequence, which the
// server updates as it delivers) are waiting there for certain. Touched only by Run's
// goroutine.
type ahead struct {
	moves []aheadMove // in the order added
}

type aheadMove struct {
	seq  uint64
	cost int64
	at   time.Time
}

// add notes jobs moved to the delivery stream at sequences seqs, of costs costs (as many; a
// missing one costs 1), at now.
func (a *ahead) add(seqs []uint64, costs []int64, now time.Time) {
	for i, seq := range seqs {
		c := int64(1)
		if i < len(costs) {
			c = costs[i]
		}
		a.moves = append(a.moves, aheadMove{seq, c, now})
	}
}

// waiting returns the jobs and units waiting in the delivery stream, given the consumer's
// delivered stream sequence and pending count: the jobs are the larger of pending and the
// moves of the last unseenFor not delivered yet; the units are the costs of the newest of the
// moves not delivered, as many as there are jobs, and unknown (an earlier leader's moves) at
// each beyond those. It forgets the moves delivered, and the oldest moves beyond the jobs
// waiting once past unseenFor (deleted before delivery: canceled).
func (a *ahead) waiting(delivered, pending uint64, now time.Time, unknown float64) (jobs int, units float64) {
	kept, recent := a.moves[:0], 0
	for _, m := range a.moves {
		if m.seq > delivered {
			kept = append(kept, m)
			if now.Sub(m.at) < unseenFor {
				recent++
			}
		}
	}
	clear(a.moves[len(kept):])
	a.moves = kept
	jobs = max(int(min(pending, math.MaxInt32)), recent)
	// Drop the oldest moves beyond jobs that the consumer had time to count: not waiting.
	drop := 0
	for drop < len(a.moves)-jobs && now.Sub(a.moves[drop].at) >= unseenFor {
		drop++
	}
	if drop > 0 {
		n := copy(a.moves, a.moves[drop:])
		clear(a.moves[n:])
		a.moves = a.moves[:n]
	}
	known := min(jobs, len(a.moves))
	for _, m := range a.moves[len(a.moves)-known:] {
		units += float64(m.cost)
	}
	units += float64(jobs-known) * unknown
	return jobs, units
}
