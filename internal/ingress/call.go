package ingress

import (
	"github.com/sluice-rl/sluice/inflight"
	"github.com/sluice-rl/sluice/limit"
)

// source says where a rule's decision came from.
type source uint8

const (
	fromStore    source = iota // the limiter
	fromFallback               // the in-process fallback, the store having failed
	failedOpen                 // no decision at all; the rule fails open
	failedClosed               // no decision at all; the rule fails closed
	fromCache                  // a rejection remembered from the store (rejectCache)
	notCharged                 // not charged: another rule's cached rejection decided
	fromLease                  // admitted from requests taken from the store ahead (leaseCache)
	fromRegion                 // refused without the store: the region's share of a global rule admits nothing now
)

// charge is one matching rule with a limit, charged for one request: what the limiter is
// asked (the request's key under the rule, the rule's limit, a cost of 1), what it decided,
// and where that decision came from.
type charge struct {
	rule *rule
	req  limit.Request
	dec  limit.Decision
	src  source
}

// call is the scratch state of one request, pooled: after the first requests, deciding one
// allocates only the string of its keys.
type call struct {
	q       request
	matched []*rule  // every matching rule
	charges []charge // the matching rules with a limit, in rule order; then those of conc
	keys    []byte   // the keys of the charges, end to end, before they become one string

	// conc are the matching concurrency rules, in rule order, decided after the others
	// (takePlaces); caps is the argument of their Acquire.
	conc []charge
	caps [1]inflight.Cap

	// reqs are the requests of one limiter call, for the charges at the same indexes in idx:
	// all of them, or those that a lease, the reject cache or the store's failure left.
	reqs []limit.Request
	idx  []int
	one  [1]limit.Decision // the decision of a call of one request (ask)

	viol []*rule // the rules a 429 names
	body []byte  // a 429's body

	costBody costBody // the request's body, read ahead for a cost
}

func (c *call) reset() {
	c.q = request{}
	clear(c.matched)
	clear(c.charges)
	clear(c.reqs)
	clear(c.viol)
	clear(c.conc)
	c.caps[0] = inflight.Cap{}
	c.matched, c.charges, c.keys, c.conc = c.matched[:0], c.charges[:0], c.keys[:0], c.conc[:0]
	c.reqs, c.idx, c.viol, c.body = c.reqs[:0], c.idx[:0], c.viol[:0], c.body[:0]
	c.costBody = costBody{}
}

// collect sets c.reqs and c.idx to the requests of the charges that want picks, and returns
// the requests.
func (c *call) collect(want func(*charge) bool) []limit.Request {
	c.reqs, c.idx = c.reqs[:0], c.idx[:0]
	for i := range c.charges {
		if ch := &c.charges[i]; want(ch) {
			c.reqs, c.idx = append(c.reqs, ch.req), append(c.idx, i)
		}
	}
	return c.reqs
}

// charged is the collect filter that picks every charge left to the store: all but those the
// region's share refused (fromRegion).
func charged(ch *charge) bool { return ch.src != fromRegion }
