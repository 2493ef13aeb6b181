package fair

import (
	"slices"
	"time"
)

// picker chooses whose jobs go next, by deficit round robin over the tenants with waiting
// jobs. It does no I/O and reads no clock: update gives it the backlogs' depths, pick the
// instant. The zero value is an empty ring. It is not safe for concurrent use.
type picker struct {
	ring []*tenant          // tenants with waiting jobs, in round-robin order
	byID map[string]*tenant // the ring's tenants by id
	pos  int                // the ring's next tenant
	// nextDue is, after a pick, when the first tenant its cap held back is due; zero if none.
	nextDue time.Time
}

// tenant is one tenant in the round robin.
type tenant struct {
	id      string
	depth   uint64    // waiting jobs, as last read, less those picked since
	weight  float64   // from the weights; 1 when they name none, or a weight <= 0
	deficit float64   // jobs it may still give in this turn
	next    time.Time // when its cap lets it give its next job
}

// pickN is one tenant's share of a pick.
type pickN struct {
	tenant string
	n      int
}

// update sets the tenants with waiting jobs to those of depths (jobs per tenant) and their
// weights: tenants not in depths leave the ring, the others keep their place, deficit and cap
// and take their new depth, and new tenants join at the ring's end in sorted order, so that
// each update treats them alike.
func (p *picker) update(depths map[string]uint64, weights map[string]float64) {
	if p.byID == nil {
		p.byID = map[string]*tenant{}
	}
	kept := p.ring[:0]
	for i, t := range p.ring {
		n, ok := depths[t.id]
		if !ok {
			delete(p.byID, t.id)
			if i < p.pos {
				p.pos--
			}
			continue
		}
		t.depth = n
		kept = append(kept, t)
	}
	clear(p.ring[len(kept):])
	p.ring = kept
	news := make([]string, 0)
	for id := range depths {
		if _, ok := p.byID[id]; !ok {
			news = append(news, id)
		}
	}
	slices.Sort(news)
	for _, id := range news {
		t := &tenant{id: id, depth: depths[id]}
		p.byID[id] = t
		p.ring = append(p.ring, t)
	}
	for _, t := range p.ring {
		t.weight = 1
		if w, ok := weights[t.id]; ok && w > 0 {
			t.weight = w
		}
	}
	if p.pos >= len(p.ring) {
		p.pos = 0
	}
}

// empty records that tenant id has no more waiting jobs (a read found fewer than picked): it
// gives none until the next update says otherwise.
func (p *picker) empty(id string) {
	if t, ok := p.byID[id]; ok {
		t.depth = 0
	}
}

// len is how many tenants have waiting jobs, as far as the picker knows.
func (p *picker) len() int { return len(p.ring) }

// pick chooses up to n jobs at instant now. A tenant's turn adds its weight to its deficit,
// and it gives one job for each whole unit of it, so over a full round tenants give jobs in
// proportion to their weights. A tenant whose turn n cuts short keeps its place and deficit for
// the next call; an empty tenant, or one its cap holds back, does not save up turns. With
// rate > 0 a tenant gives at most one job per 1/rate seconds (GCRA, burst 1). It returns the
// jobs per tenant, in the order first chosen. caps may hold tenants back besides: a rate of
// their own, or a hold (a paused tenant gives nothing, as one its cap holds back).
func (p *picker) pick(n int, rate float64, now time.Time, caps ...tenantCaps) []pickN {
	p.nextDue = time.Time{}
	var c tenantCaps
	if len(caps) > 0 {
		c = caps[0]
	}
	var out []pickN
	idle := 0 // turns in a row that gave nothing: a whole round of them ends the call
	for n > 0 && len(p.ring) > 0 && idle <= len(p.ring) {
		t := p.ring[p.pos]
		if t.deficit < 1 {
			t.deficit += t.weight
		}
		k := min(int(t.deficit), n, int(min(t.depth, uint64(n))))
		capped := false // the cap holds the tenant back now
		r := c.rate(t.id, rate)
		if k > 0 && c.held != nil && c.held(t.id) {
			k, capped = 0, true
		} else if k > 0 && r > 0 {
			if a := p.allowed(t, r, now); a == 0 {
				k, capped = 0, true
			} else {
				k = min(k, a)
			}
		}
		if k > 0 {
			t.deficit -= float64(k)
			t.depth -= uint64(k)
			n -= k
			out = appendPick(out, t.id, k)
			idle = 0
		} else {
			idle++
		}
		if t.deficit >= 1 && t.depth > 0 && n == 0 {
			break // its turn goes on next time
		}
		if t.depth == 0 || capped {
			t.deficit = 0
		}
		p.pos = (p.pos + 1) % len(p.ring)
	}
	return out
}

// allowed is how many jobs tenant t may give now under a cap of rate per second, spaced 1/rate
// apart; it spends them. A tenant held back sets nextDue if it is the first due.
func (p *picker) allowed(t *tenant, rate float64, now time.Time) int {
	if t.next.After(now) {
		if p.nextDue.IsZero() || t.next.Before(p.nextDue) {
			p.nextDue = t.next
		}
		return 0
	}
	t.next = now.Add(time.Duration(float64(time.Second) / rate))
	return 1
}

// tenantCaps hold single tenants back in a pick, beyond the queue's TenantRate.
type tenantCaps struct {
	// rates are the tenants' own rates (per second, > 0), in place of the queue's.
	rates map[string]float64
	// held reports whether a tenant is held back now; nil: none is.
	held func(tenant string) bool
}

// rate is tenant's rate: its own, or def.
func (c tenantCaps) rate(tenant string, def float64) float64 {
	if r, ok := c.rates[tenant]; ok && r > 0 {
		return r
	}
	return def
}

func appendPick(out []pickN, id string, k int) []pickN {
	for i := range out {
		if out[i].tenant == id {
			out[i].n += k
			return out
		}
	}
	return append(out, pickN{id, k})
}
