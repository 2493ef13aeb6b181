package regions

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"
)

// Pacer paces one holder's renewals of one budget: every period (the fallback, which the bound
// rests on), and in between when asked (Soon: a change of the record that makes a renewal
// matter, Watch; the instant a renewal named, Lease.Retry), never two asked ones starting
// within gap. Safe for concurrent use.
type Pacer struct {
	mu   sync.Mutex
	at   time.Time // the earliest instant asked for; zero: none
	kick chan struct{}
	gap  time.Duration
}

// NewPacer returns a pacer with nothing asked, whose asked renewals start at least gap apart
// (Run).
func NewPacer(gap time.Duration) *Pacer { return &Pacer{kick: make(chan struct{}, 1), gap: gap} }

// Soon asks for a renewal from at on (and a random part of Run's gap later); the earliest ask
// wins.
func (p *Pacer) Soon(at time.Time) {
	p.mu.Lock()
	at = at.Add(time.Duration(rand.Int64N(int64(p.gap) + 1)))
	if p.at.IsZero() || at.Before(p.at) {
		p.at = at
	}
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Run calls renew at once and every period after, and whenever asked, until ctx ends; periodic
// tells renew which it is, and renew reports whether it lost a race to another writer.
// Asked renewals start at least gap after the previous start, and a random part of gap after
// the instant asked for.
//
// The region's holders see the same changes and may start together: their renewals would
// then collide on the coordinator's compare-and-set (one more round trip each, over a gateway
// a slow one). So the periodic renewal after the first, or after one that lost a race, comes
// a random half period to a period later (holders in step spread over the period), each
// other one up to a tenth of the period early, and asked ones spread over gap.
func (p *Pacer) Run(ctx context.Context, period time.Duration, renew func(ctx context.Context, periodic bool) (raced bool)) {
	gap := p.gap
	next := time.Now()
	first := true
	var last time.Time
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		now := time.Now()
		periodic := !now.Before(next)
		p.mu.Lock()
		asked := !p.at.IsZero() && !now.Before(p.at) && !now.Before(last.Add(gap))
		if periodic || asked {
			p.at = time.Time{} // this renewal answers every ask so far
		}
		p.mu.Unlock()
		if periodic || asked {
			last = now
			raced := renew(ctx, periodic)
			if periodic || raced {
				early := period / 10
				if first || raced {
					early, first = period/2, false
				}
				next = now.Add(period - time.Duration(rand.Int64N(int64(early)+1)))
			}
		}
		wake := next
		p.mu.Lock()
		if !p.at.IsZero() {
			if a := later(p.at, last.Add(gap)); a.Before(wake) {
				wake = a
			}
		}
		p.mu.Unlock()
		timer.Reset(max(time.Until(wake), 0))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-p.kick:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		}
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
