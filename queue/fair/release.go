package fair

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Release by acknowledgement: how a moved job leaves its tenant's backlog.
//
// Model. The backlog stream has one push consumer, the hold (queue.FairLayout.Hold), that
// delivers each job's headers to processes that drop them and never acknowledges, so every
// job is pending there soon after it is stored. A job moved to the delivery stream leaves the
// backlog by the hold's acknowledgement of its stream sequence (FairLayout.HoldAck), sent with
// a reply subject: nats-server removes it from the work-queue stream and answers. A round
// knows how far the hold has delivered (its consumer info, reread when a moved job is past the
// last reading: about once per round that moves jobs stored since) and sends the
// acknowledgements of all its moved jobs at once, then awaits their answers together.
//
// Guarantees. A job still leaves only after its copy in the delivery stream is acknowledged,
// and an acknowledgement names one stream sequence, which the stream never reuses: a repeated
// one removes nothing else. A job above the hold's delivered sequence, or whose
// acknowledgement gets no answer within holdWait (the hold missing, no process subscribed,
// the server gone), is deleted instead (a JetStream API request), which also drops it from the
// hold's pending. While the backlog has a hold, a tenant's share is never removed by a subject
// purge: nats-server 2.15 then walks the hold's whole pending map and loads each entry's
// message. A backlog without one (made before it, and not provisioned since) is emptied as
// before: a job by its deletion, a larger share by one purge of its subject.
//
// Costs. nats-server spends ~6 µs of CPU on an acknowledgement that removes a work-queue
// message, where a deletion costs ~30 µs (the API request path); the hold adds one delivery
// per job (its headers, to one process) and one pending entry per waiting job in the server's
// memory, written with the consumer's state at most 10 times a second while it changes. The
// scheduler sends the acknowledgements without a goroutine or a JSON document each, over one
// subscription per round.

// holdWait bounds the wait for the answers to a round's acknowledgements; the jobs not
// answered by then are deleted instead.
const holdWait = 2 * time.Second

// openHold finds the backlog's hold consumer; nil when it has none (a backlog made before
// it). It looks again at most every fullEvery while it is missing.
func (s *Scheduler) openHold(ctx context.Context) {
	if s.hold != nil || s.now().Sub(s.holdLooked) < fullEvery {
		return
	}
	s.holdLooked = s.now()
	h, err := s.l.JetStream.PushConsumer(ctx, s.l.Backlog, s.l.Hold)
	if err != nil {
		if !errors.Is(err, jetstream.ErrConsumerNotFound) && ctx.Err() == nil {
			s.Options().Logger.Warn("fair: backlog hold consumer", "queue", s.l.Queue, "err", err)
		}
		return
	}
	s.hold = h
	s.heldTo.Store(h.CachedInfo().Delivered.Stream)
}

// heldBy reports whether the hold had delivered backlog sequence seq, rereading how far it
// has (its consumer info) when the last reading is short of seq: once per round that moves
// jobs stored since. Safe for concurrent use while a round moves.
func (s *Scheduler) heldBy(ctx context.Context, seq uint64) bool {
	if s.hold == nil {
		return false
	}
	if seq <= s.heldTo.Load() {
		return true
	}
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	if seq > s.heldTo.Load() {
		if ci, err := s.hold.Info(ctx); err == nil {
			s.heldTo.Store(ci.Delivered.Stream)
		}
	}
	return seq <= s.heldTo.Load()
}

// remove removes raws, a tenant's oldest jobs on subj just moved, from the backlog: by
// acknowledgement when the backlog has a hold (removeSeqs), else one job by its deletion and
// more by one purge of the subject below the last one's.
func (s *Scheduler) remove(ctx context.Context, subj string, raws []*jetstream.RawStreamMsg) error {
	if s.hold == nil && len(raws) > 1 {
		err := s.backlog.Purge(ctx, jetstream.WithPurgeSubject(subj), jetstream.WithPurgeSequence(raws[len(raws)-1].Sequence+1))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		return err
	}
	seqs := make([]uint64, len(raws))
	for i, raw := range raws {
		seqs[i] = raw.Sequence
	}
	return errors.Join(s.removeSeqs(ctx, seqs)...)
}

// removeSeqs removes backlog jobs seqs, and returns each one's error (nil: removed, or
// canceled meanwhile). Those the hold delivered go by acknowledgements, all sent before any
// answer is awaited; the others, and those not answered within holdWait, by deletions,
// deleteParallel at once. Safe for concurrent use while a round moves.
func (s *Scheduler) removeSeqs(ctx context.Context, seqs []uint64) []error {
	errs := make([]error, len(seqs))
	if len(seqs) > 0 {
		s.heldBy(ctx, slices.Max(seqs)) // rereads the hold once if needed
	}
	var held []int
	for k, seq := range seqs {
		if s.hold != nil && seq <= s.heldTo.Load() {
			held = append(held, k)
		}
	}
	done := s.ackHeld(ctx, seqs, held)
	var wg sync.WaitGroup
	sem := make(chan struct{}, deleteParallel)
	for k, seq := range seqs {
		if done[k] {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := s.backlog.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
				errs[k] = err
			}
		}()
	}
	wg.Wait()
	s.deleted.Add(uint64(len(seqs) - countTrue(done)))
	return errs
}

// ackHeld acknowledges backlog jobs seqs[k] for k in which to the hold, and returns which
// were answered (removed). It sends every acknowledgement, then awaits the answers, over one
// subscription to a fresh inbox: the k-th answers to <inbox>.<k>.
func (s *Scheduler) ackHeld(ctx context.Context, seqs []uint64, which []int) []bool {
	done := make([]bool, len(seqs))
	if len(which) == 0 {
		return done
	}
	nc := s.l.JetStream.Conn()
	inbox := nc.NewInbox()
	// A channel the size of the answers: at most one per acknowledgement.
	ch := make(chan *nats.Msg, len(which))
	sub, err := nc.ChanSubscribe(inbox+".*", ch)
	if err != nil {
		return done
	}
	defer sub.Unsubscribe() //nolint:errcheck // the inbox is this call's alone
	sent := 0
	for _, k := range which {
		if nc.PublishRequest(s.l.HoldAck(seqs[k]), inbox+"."+strconv.Itoa(k), nil) != nil {
			break
		}
		sent++
	}
	t := time.NewTimer(holdWait)
	defer t.Stop()
	for range sent {
		select {
		case m := <-ch:
			// A status (503: no responders, the hold missing) is no removal.
			if k, err := strconv.Atoi(m.Subject[len(inbox)+1:]); err == nil && k < len(done) && m.Header.Get("Status") == "" {
				done[k] = true
			}
		case <-t.C:
			return done
		case <-ctx.Done():
			return done
		}
	}
	return done
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}
