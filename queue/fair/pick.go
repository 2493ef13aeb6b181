package fair

import (
	"math"
	"slices"
	"time"
)

// picker chooses whose jobs go next, by deficit round robin over the tenants with waiting
// jobs. It does no I/O and reads no clock: update gives it the backlogs' depths, pick the
// instant, charge the costs of the jobs moved. The zero value is an empty ring that counts
// jobs. It is not safe for concurrent use.
type picker struct {
	ring []*tenant          // tenants with waiting jobs, in round-robin order
	byID map[string]*tenant // the ring's tenants by id
	pos  int                // the ring's next tenant
	// nextDue is, after a pick, when the first tenant its cap held back is due; zero if none.
	nextDue time.Time
	// byUnits makes a visit count units (the jobs' costs) instead of jobs.
	byUnits bool
	// quantum is the largest cost known of a job of a tenant in the ring, 0 if none is: by
	// units, what a visit adds to a tenant's deficit per unit of its weight, so that any tenant
	// of weight 1 gives at least one job a visit; the estimate of a tenant whose cost is not
	// known yet.
	quantum float64
}

// tenant is one tenant in the round robin.
type tenant struct {
	id      string
	depth   uint64    // waiting jobs, as last read, less those picked since
	weight  float64   // from the weights; 1 when they name none, or a weight <= 0
	deficit float64   // jobs (by units: units) it may still give in this visit; < 0: owed
	visit   bool      // its visit goes on: the next pick starts with it, adding nothing
	next    time.Time // when its cap lets it give its next job
	// cost is the cost of the last of its jobs moved, the estimate of its next ones' (their
	// costs are read only as they are moved); 0: none moved since it joined the ring.
	cost float64
}

// pickN is one tenant's share of a pick.
type pickN struct {
	tenant string
	n      int
	units  float64 // what the n jobs cost at the tenant's estimate (charge corrects it)
}

// budget is what a pick may choose: up to jobs jobs, and jobs while units > 0 (the last may
// cost more than is left: a job is never split); +Inf: no bound in units.
type budget struct {
	jobs  int
	units float64
}

// update sets the tenants with waiting jobs to those of depths (jobs per tenant) and their
// weights: tenants not in depths leave the ring, the others keep their position, deficit, cap
// and cost estimate and take their new depth, and new tenants join at the ring's end in sorted
// order, so that each update treats them alike.
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
	p.quantum = 0
	for _, t := range p.ring {
		t.weight = 1
		if w, ok := weights[t.id]; ok && w > 0 {
			t.weight = w
		}
		p.quantum = max(p.quantum, t.cost)
	}
	if p.pos >= len(p.ring) {
		p.pos = 0
	}
}

// setByUnits sets what a visit counts, units or jobs; a change clears the deficits, which
// counted the other.
func (p *picker) setByUnits(on bool) {
	if p.byUnits == on {
		return
	}
	p.byUnits = on
	for _, t := range p.ring {
		t.deficit, t.visit = 0, false
	}
}

// empty records that tenant id has no more waiting jobs (a read found fewer than picked): it
// gives none until the next update says otherwise.
func (p *picker) empty(id string) {
	if t, ok := p.byID[id]; ok {
		t.depth = 0
	}
}

// charge records the costs of the jobs moved of a tenant's share picked at units (pickN.units),
// in order: by units its deficit takes their true costs in place of the estimate, and the last
// one's cost is its next estimate.
func (p *picker) charge(id string, units float64, costs []int64) {
	t, ok := p.byID[id]
	if !ok || len(costs) == 0 && !p.byUnits {
		return
	}
	var actual float64
	for _, c := range costs {
		actual += float64(c)
	}
	if p.byUnits {
		t.deficit += units - actual
	}
	if len(costs) > 0 {
		t.cost = float64(costs[len(costs)-1])
		p.quantum = max(p.quantum, t.cost)
	}
}

// estimate is what tenant t's next job is expected to cost: its last one's cost, else the
// largest known, else all of room (a new tenant is assumed to cost the most until its first
// job is read; with none known, as much as may be moved), at least 1.
func (p *picker) estimate(t *tenant, room float64) float64 {
	switch {
	case t.cost > 0:
		return t.cost
	case p.quantum > 0:
		return p.quantum
	case !math.IsInf(room, 1):
		return max(room, 1)
	}
	return 1
}

// len is how many tenants have waiting jobs, as far as the picker knows.
func (p *picker) len() int { return len(p.ring) }

// pick chooses jobs within b at instant now. A tenant's visit adds its weight to its deficit
// (by units: its weight times the quantum), and it gives one job for each whole job (by
// units: each estimated cost) of it, so over a full round tenants give jobs (units) in
// proportion to their weights. A tenant whose visit b cuts short keeps its position and
// deficit for the next call; an empty tenant, or one its cap holds back, does not save up
// visits (by units, it keeps what it owes). With rate > 0 a tenant gives at most one job per
// 1/rate seconds (GCRA, burst 1). It returns the jobs per tenant, in the order first chosen,
// each with the units it was charged at (charge corrects them). caps may hold tenants back
// besides: a rate of their own, or a hold (a paused tenant gives nothing, as one its cap holds
// back).
func (p *picker) pick(b budget, rate float64, now time.Time, caps ...tenantCaps) []pickN {
	p.nextDue = time.Time{}
	var c tenantCaps
	if len(caps) > 0 {
		c = caps[0]
	}
	var out []pickN
	idle := 0 // visits in a row that gave nothing: a whole round of them ends the call
	for b.jobs > 0 && b.units > 0 && len(p.ring) > 0 && idle <= len(p.ring) {
		t := p.ring[p.pos]
		est := p.estimate(t, b.units)
		per := p.visit(t, est)
		k, capped := p.capped(t, p.affords(t, per, est, b), c, rate, now)
		if k > 0 {
			t.deficit -= float64(k) * per
			t.depth -= uint64(k)
			b.jobs -= k
			b.units -= float64(k) * est
			out = appendPick(out, t.id, k, float64(k)*est)
			idle = 0
		} else {
			idle++
		}
		if t.deficit >= per && t.depth > 0 && (b.jobs == 0 || b.units <= 0) {
			break // its visit goes on next time
		}
		t.visit = false
		if t.depth == 0 || capped {
			t.deficit = min(t.deficit, 0)
		}
		p.pos = (p.pos + 1) % len(p.ring)
	}
	return out
}

// visit begins tenant t's visit, unless it goes on, and returns what one of its jobs takes of
// its deficit: 1, or by units its estimate est.
func (p *picker) visit(t *tenant, est float64) (per float64) {
	per, gain := 1.0, t.weight // what a job takes, and a visit adds
	if p.byUnits {
		per, gain = est, t.weight*max(p.quantum, est)
	}
	if !t.visit {
		t.deficit += gain
		t.visit = true
	}
	return per
}

// affords is how many jobs tenant t may give within b: those its deficit pays for at per each,
// no more than wait, nor than b allows (in units at est each, the last one allowed to take
// more than is left); by units, one while its cost is not known.
func (p *picker) affords(t *tenant, per, est float64, b budget) int {
	k := max(0, min(int(t.deficit/per), b.jobs, int(min(t.depth, uint64(b.jobs)))))
	if !math.IsInf(b.units, 1) {
		k = min(k, int(math.Ceil(b.units/est)))
	}
	if p.byUnits && t.cost == 0 {
		k = min(k, 1)
	}
	return k
}

// capped bounds k jobs of tenant t by its caps at now (a hold, its rate or rate), and reports
// whether they hold it back altogether.
func (p *picker) capped(t *tenant, k int, c tenantCaps, rate float64, now time.Time) (int, bool) {
	if k == 0 {
		return 0, false
	}
	if c.held != nil && c.held(t.id) {
		return 0, true
	}
	if r := c.rate(t.id, rate); r > 0 {
		a := p.allowed(t, r, now)
		if a == 0 {
			return 0, true
		}
		return min(k, a), false
	}
	return k, false
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

func appendPick(out []pickN, id string, k int, units float64) []pickN {
	for i := range out {
		if out[i].tenant == id {
			out[i].n += k
			out[i].units += units
			return out
		}
	}
	return append(out, pickN{id, k, units})
}
