package regions

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// material is the change of a holder's share, as a part of the budget, that a record's change
// must make before the holder renews at once (Wants): smaller ones wait for its next period.
// Every write is seen by every holder of every region; without it each write would answer
// with another.
const material = 0.01

// Wants reports whether holder's renewal of region's lease, with demand, would matter at now,
// and from when, as a holder that watches the record decides on each change:
//
//   - at once, when the rule (Renew) would give it a share that differs from the one it
//     acknowledged by more than 1% of the budget (another holder of its region lowered the
//     region's share, which it must acknowledge; another region asks for more, which it must
//     give; budget it is short of is free), or when it has no unexpired entry;
//   - at Retry, when the share it would get now is short of its target but another region's
//     budget frees up within a renew period (a lowered share stops lingering);
//   - when the record's hold ends, while it is held;
//   - not at all otherwise: its next periodic renewal will do.
func Wants(rec Record, region, holder string, demand float64, t Terms, now time.Time) (time.Time, bool) {
	if now.Before(rec.HoldUntil) {
		return rec.HoldUntil, true
	}
	mine, ok := rec.Leases[region].Holders[holder]
	if !ok || !now.Before(mine.Expires) {
		return now, true
	}
	_, l := Renew(rec, region, holder, demand, t, now)
	if math.Abs(l.Share-mine.Share) > material*t.Budget {
		return now, true
	}
	if !l.Retry.IsZero() {
		return l.Retry, true
	}
	return time.Time{}, false
}

// Watch watches queue's record on the coordinator until ctx ends (a JetStream key-value watch:
// an ordered push consumer, which crosses gateways as a renewal does) and calls soon with the
// instant from which a renewal matters, whenever a change says it does (Wants, with the
// lower of the holder's last demand and its region's latest, and terms()). A watch that breaks is made again after a renew period;
// meanwhile the holder renews on its period alone, which the bound rests on: a holder that
// hears nothing keeps its acknowledged share counted until it renews or expires.
func (c *Coordinator) Watch(ctx context.Context, queue string, terms func() Terms, soon func(at time.Time)) {
	for ctx.Err() == nil {
		c.watchOnce(ctx, queue, terms, soon)
		select {
		case <-ctx.Done():
		case <-time.After(terms().Renew):
		}
	}
}

// watchOnce watches queue's record until the watch breaks or ctx ends, or delivers nothing
// for two renew periods: every holder writes once a period, so the watch is broken or stuck
// behind (its consumer lost across a cut, say) and is made again.
func (c *Coordinator) watchOnce(ctx context.Context, queue string, terms func() Terms, soon func(at time.Time)) {
	kv, err := c.bucket(ctx, false)
	if err != nil {
		return
	}
	w, stop := c.startWatch(ctx, kv, queue, terms().Renew)
	if w == nil {
		return
	}
	defer stop()
	quiet := time.NewTimer(2 * terms().Renew)
	defer quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-quiet.C:
			return
		case e, ok := <-w.Updates():
			quiet.Reset(2 * terms().Renew)
			if !ok {
				return
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var rec Record
			if json.Unmarshal(e.Value(), &rec) != nil {
				continue
			}
			c.saw(queue, rec, e.Revision())
			c.mu.Lock()
			demand, renewed := c.demands[queue]
			c.mu.Unlock()
			if !renewed {
				continue // the holder's first renewal is its period's
			}
			// Another holder of the region that reported less (it read the queue's backlog
			// later) has lowered the region's share: this one acknowledges it now, and reads
			// the backlog afresh for it. Only downward: a higher report moves nobody.
			if l, ok := rec.Leases[c.region]; ok {
				demand = min(demand, l.Demand)
			}
			if at, ok := Wants(rec, c.region, c.id, demand, terms(), c.now()); ok {
				soon(at)
			}
		}
	}
}

// startWatch starts a watch of queue's record, waiting at most wait for it: making its consumer
// needs the JetStream meta leader, which a supercluster without quorum (two regions cut apart,
// the minutes after a heal) does not have, and the request may hang well beyond a renew
// period. It returns nil when the watch did not start in time; else the watch and the function
// that stops it.
func (c *Coordinator) startWatch(ctx context.Context, kv jetstream.KeyValue, queue string, wait time.Duration) (jetstream.KeyWatcher, func()) {
	wctx, cancel := context.WithCancel(ctx)
	type started struct {
		w   jetstream.KeyWatcher
		err error
	}
	done := make(chan started, 1)
	go func() {
		w, err := kv.Watch(wctx, queue)
		done <- started{w, err}
	}()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case s := <-done:
		if s.err != nil {
			cancel()
			return nil, nil
		}
		return s.w, func() { _ = s.w.Stop(); cancel() }
	case <-timer.C:
		cancel()
		go func() { // the watch may still start after all: stop it then
			if s := <-done; s.err == nil {
				_ = s.w.Stop()
			}
		}()
		return nil, nil
	}
}

// Release gives up the holder's entry in queue's record (a holder that stops cleanly): its
// share stops counting once the slots it reserved ahead are spent (Release, the pure rule),
// not when its lease would have expired. A holder that dies without it counts until its
// entry expires: one lease.
func (c *Coordinator) Release(ctx context.Context, queue string, t Terms) error {
	kv, err := c.bucket(ctx, false)
	if err != nil {
		return err
	}
	for range casTries {
		e, err := kv.Get(ctx, queue)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		var rec Record
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			return err
		}
		if _, ok := rec.Leases[c.region].Holders[c.id]; !ok {
			return nil
		}
		b, err := json.Marshal(Release(rec, c.region, c.id, t, c.now()))
		if err != nil {
			return err
		}
		if _, err = kv.Update(ctx, queue, b, e.Revision()); err == nil || !isWrongRevision(err) {
			return err
		}
	}
	return errors.New("regions: release: too many concurrent renewals")
}
