package fair

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// deleteParallel bounds the backlog deletes of one removeSeqs under way at once.
const deleteParallel = 128

// single is a share that is one job of a tenant's level where the last reading counted one
// job: picks[i]'s, on backlog subject subj, level level (in the order of queue.Priorities).
type single struct {
	i     int
	level int
	subj  string
}

// moveSingles moves the jobs of singles, and writes what it did into res[single.i]. Many
// tenants of one job each would cost a round trip per tenant for its read, its copy and its
// delete, tenant after tenant; here the reads are one multi_last direct get per maxMulti
// subjects, the copies are all published before any acknowledgement is awaited, and the jobs
// leave the backlog together (removeSeqs: by the hold's acknowledgements, all sent at once). The last job at or below the reading's last sequence
// (readTo) on such a subject is its only one there, so the level's oldest: any job that arrived
// since is above it. A subject with no job there is found empty (moved or canceled since). A
// failed read is logged once, and leaves its tenants with nothing moved until the next
// refresh (which then lists the subjects), as a failed move of one tenant's share does. It
// runs on Run's goroutine.
func (s *Scheduler) moveSingles(ctx context.Context, singles []single, res []moved) {
	raws := make([]*jetstream.RawStreamMsg, len(singles))
	read := make([]bool, len(singles)) // the read of single k's subject answered
	for from := 0; from < len(singles); from += maxMulti {
		chunk := singles[from:min(from+maxMulti, len(singles))]
		subjs := make([]string, len(chunk))
		at := make(map[string]int, len(chunk))
		for k, sg := range chunk {
			subjs[k], at[sg.subj] = sg.subj, from+k
		}
		got, err := s.get.multiLast(ctx, subjs, s.readTo)
		for _, raw := range got {
			if k, ok := at[raw.Subject]; ok {
				raws[k] = raw
			}
		}
		if err != nil {
			s.stale = true
			if ctx.Err() == nil {
				s.Options().Logger.Warn("fair: scheduler: read", "queue", s.l.Queue, "tenants", len(chunk), "err", err)
			}
			continue
		}
		for k := range chunk {
			read[from+k] = true
		}
	}
	futs := make([]jetstream.PubAckFuture, len(singles))
	for k, raw := range raws {
		if raw == nil {
			res[singles[k].i].empty[singles[k].level] = read[k]
			continue
		}
		fut, err := s.l.JetStream.PublishMsgAsync(s.l.Forward(raw))
		if err != nil {
			res[singles[k].i].err = err
			continue
		}
		futs[k] = fut
	}
	// Once copies are sent, the moves are finished even when ctx ends, as in moveLevel.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	var moved []int // singles k whose copies were acknowledged
	for k, fut := range futs {
		if fut == nil {
			continue
		}
		seqs, err := acked(fctx, futs[k:k+1])
		r := &res[singles[k].i]
		if err != nil {
			r.err = err
			continue
		}
		r.n, r.seqs, r.costs = 1, seqs, []int64{s.l.Cost(raws[k])}
		moved = append(moved, k)
	}
	seqs := make([]uint64, len(moved))
	for j, k := range moved {
		seqs[j] = raws[k].Sequence
	}
	for j, err := range s.removeSeqs(fctx, seqs) {
		k := moved[j]
		if err != nil {
			res[singles[k].i].err = err // moved again by a later round, and dropped as a duplicate
			continue
		}
		res[singles[k].i].upTo[singles[k].level] = raws[k].Sequence + 1
	}
}
