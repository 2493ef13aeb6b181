package fair

import "time"

// unseenFor is how long a job the scheduler moved counts as waiting in the delivery stream
// whatever the consumer says (unseen). The consumer's count catches up within a moment; the
// bound keeps a moved job that was deleted there before its delivery (canceled) from holding
// a place in Target for longer.
const unseenFor = 100 * time.Millisecond

// unseen are the delivery-stream sequences of the jobs the leader moved in the last
// unseenFor. The server acknowledges a publish before it tells the stream's consumers of the
// new message, so a consumer's pending count read right after a move can miss the jobs just
// moved, and a round that trusted it would move up to Target more. Those of the moved jobs the
// consumer has not delivered yet (sequences above its delivered stream sequence, which the
// server updates as it delivers) are waiting there for certain: the scheduler counts the
// larger of the two. Touched only by Run's goroutine.
type unseen struct {
	moves []unseenMove
}

type unseenMove struct {
	seq uint64
	at  time.Time
}

// add notes jobs moved to the delivery stream at sequences seqs, at now.
func (u *unseen) add(seqs []uint64, now time.Time) {
	for _, seq := range seqs {
		u.moves = append(u.moves, unseenMove{seq, now})
	}
}

// waiting forgets the moves delivered (at or below sequence delivered) or older than
// unseenFor, and returns how many are left: jobs waiting in the delivery stream.
func (u *unseen) waiting(delivered uint64, now time.Time) int {
	kept := u.moves[:0]
	for _, m := range u.moves {
		if m.seq > delivered && now.Sub(m.at) < unseenFor {
			kept = append(kept, m)
		}
	}
	clear(u.moves[len(kept):])
	u.moves = kept
	return len(kept)
}
