package regions

import (
	"context"
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
}

// NewPacer returns a pacer with nothing asked.
func NewPacer() *Pacer { return &Pacer{kick: make(chan struct{}, 1)} }

// Soon asks for a renewal from at on; the earliest ask wins.
func (p *Pacer) Soon(at time.Time) {
	p.mu.Lock()
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
// tells renew which it is. Asked renewals start at least gap after the previous start.
func (p *Pacer) Run(ctx context.Context, period, gap time.Duration, renew func(ctx context.Context, periodic bool)) {
	next := time.Now()
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
			if periodic {
				next = now.Add(period)
			}
			renew(ctx, periodic)
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
