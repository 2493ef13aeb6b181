package ingress

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/cost"
	"github.com/sluice-rl/sluice/limit"
)

// maxCostAnswer is the most of an upstream's answer the ingress keeps to read its true cost
// (cost_from_response: json:…). The answer is passed on as it arrives all the same; a longer
// one leaves the charge standing.
const maxCostAnswer = 1 << 20

// reconcile is one charge of a forwarded request whose rule reads its true cost from the
// upstream's answer (cost_from_response): once the answer is in, the difference is charged
// or refunded to the key the charge was made against.
type reconcile struct {
	rule *rule
	key  string
	dec  limit.Decision
}

// reconciles collects, into h, the charges of k that are to be reconciled: admitted by the
// shared store (or the in-process limiter), by a rule with cost_from_response. A decision
// of the fallback limiter, made while the store failed, is not reconciled: the store never saw
// it.
func (k *call) reconciles(h *held) {
	for i := range k.charges {
		ch := &k.charges[i]
		if c := ch.rule.cost; c != nil && c.from.IsSet() && ch.src == fromStore && ch.dec.Allowed {
			h.recon = append(h.recon, reconcile{rule: ch.rule, key: ch.req.Key, dec: ch.dec})
		}
	}
}

// answerBody keeps the start of an upstream's answer for reading its true cost, or, when the
// answer is streamed (cost.IsStream), reads its events as they pass and keeps none of them.
type answerBody struct {
	b      []byte
	over   bool         // the answer was longer than maxCostAnswer
	keep   bool         // the true costs read the body (needsBody)
	stream *cost.Stream // the answer is streamed: its events, read as they pass; nil: not
	recon  []reconcile  // the charges whose costs the events are read for
	cut    bool         // a rule's cut_on_debt ended the stream (debtCut)
}

// cuts reports whether a rule of recon ends its streams on debt (cut_on_debt).
func cuts(recon []reconcile) bool {
	for _, rc := range recon {
		if rc.rule.cost.cutDebt > 0 {
			return true
		}
	}
	return false
}

// overDebt reports whether what the stream's events said so far is more than a rule's
// cut_on_debt above its charge.
func (a *answerBody) overDebt(h http.Header) bool {
	for _, rc := range a.recon {
		if d := rc.rule.cost.cutDebt; d > 0 && a.stream.Seen(rc.rule.cost.from, h) > rc.dec.Cost+d {
			return true
		}
	}
	return false
}

// answerKey is the context key of the answerBody of a request whose rules end streams on
// debt: the proxy's ModifyResponse finds it there (debtCutter).
type answerKey struct{}

// debtCut is the body of a streamed answer whose rule has cut_on_debt: once the events passed
// on owe more than the bound, it ends (io.EOF) before the next read, so the client's answer
// ends cleanly after the last whole read (the upstream's flushes are event boundaries) and
// the upstream's connection is closed.
type debtCut struct {
	io.ReadCloser
	a *answerBody
	h http.Header
}

func (d *debtCut) Read(p []byte) (int, error) {
	if d.a.stream != nil && !d.a.cut && d.a.overDebt(d.h) {
		d.a.cut = true
	}
	if d.a.cut {
		return 0, io.EOF
	}
	return d.ReadCloser.Read(p)
}

// debtCutter is the proxy's ModifyResponse: the body of an answer to a request whose rules
// end streams on debt reads through debtCut.
func debtCutter(res *http.Response) error {
	if a, ok := res.Request.Context().Value(answerKey{}).(*answerBody); ok {
		res.Body = &debtCut{ReadCloser: res.Body, a: a, h: res.Header}
	}
	return nil
}

// header looks at the answer's header, before its body: a streamed answer is read event by
// event.
func (a *answerBody) header(h http.Header) {
	ct := h["Content-Type"]
	if len(ct) == 0 {
		return
	}
	if ok, sse := cost.IsStream(ct[0]); ok {
		costs := make([]config.Cost, len(a.recon))
		for i, rc := range a.recon {
			costs[i] = rc.rule.cost.from
		}
		a.stream = cost.NewStream(sse, costs...)
	}
}

func (a *answerBody) write(p []byte) {
	if a.stream != nil {
		a.stream.Write(p)
		return
	}
	if a.over || !a.keep {
		return
	}
	if len(a.b)+len(p) > maxCostAnswer {
		a.over, a.b = true, nil
		return
	}
	a.b = append(a.b, p...)
}

// needsBody reports whether reading the true costs of h needs the answer's body.
func (h *held) needsBody() bool {
	for _, rc := range h.recon {
		if rc.rule.cost.from.Reads(func(k config.CostKind) bool { return k == config.CostJSON }) {
			return true
		}
	}
	return false
}

// settleCosts reads each reconciled charge's true cost from the answer (its header, and the
// kept body, nil when not kept or too long; or the events of a streamed answer) and charges or
// refunds the difference. It runs after the answer has been passed on, so the client never
// waits for it. A true cost that cannot be read leaves the charge as it was; an extra charge
// the store fails is kept and made again after a later Adjust succeeds (owed.go). A streamed
// answer that did not finish (cut: the client gone, the upstream reset, the rule's timeout) is
// charged as its rule's cost_on_cut says: its estimate (the charge stands), or what its events
// said so far.
func (g *gate) settleCosts(h *held, header map[string][]string, body *answerBody, finished bool, timeout time.Duration) {
	if body != nil && body.stream != nil {
		body.stream.End()
	}
	paid := false // an Adjust succeeded: the store answers, and owed charges can be made
	defer func() {
		if paid {
			g.payOwed(timeout)
		}
	}()
	for _, rc := range h.recon {
		used, ok, stands := g.trueCost(rc, header, body, finished)
		if stands {
			continue
		}
		if !ok {
			g.metrics.unreconciled.WithLabelValues(rc.rule.name).Inc()
			continue
		}
		if used == rc.dec.Cost {
			continue
		}
		if used > rc.dec.Cost {
			// An extra charge is made at most once, however often it is asked (owed.go).
			rc.dec.ChargeID = chargeID()
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		err := g.limiter.Adjust(ctx, rc.key, rc.rule.spec, rc.dec, used)
		cancel()
		if errors.Is(err, limit.ErrChargeMade) {
			err = nil // cannot happen on a first call: its ID is new
		}
		if errors.Is(err, limit.ErrDebtCapped) {
			g.metrics.debtCapped.WithLabelValues(rc.rule.name).Inc()
			g.log.Warn("ingress: a key owes more than its rule's debt cap; the rest of the true cost is dropped",
				"rule", rc.rule.name, "debt_capacities", limit.DebtCapacities)
			err = nil
		}
		if err != nil {
			g.metrics.storeErrors.Inc()
			g.metrics.unreconciled.WithLabelValues(rc.rule.name).Inc()
			g.log.Debug("ingress: a request's true cost could not be charged or refunded; an extra charge is kept to make again (owed.go)",
				"rule", rc.rule.name, "err", err)
			if !isBadInput(err) {
				g.owe(rc, used)
			}
			continue
		}
		paid = true
		if used > rc.dec.Cost {
			g.metrics.reconciled.WithLabelValues(rc.rule.name, "charge").Add(float64(used - rc.dec.Cost))
		} else {
			g.metrics.reconciled.WithLabelValues(rc.rule.name, "refund").Add(float64(rc.dec.Cost - used))
		}
	}
}

// trueCost reads rc's true cost from the answer: its header and kept body, or the events of a
// streamed answer. stands reports that the entry charge stands as it is (a stream cut short,
// charged its estimate by cost_on_cut); ok is false when the cost could not be read.
func (g *gate) trueCost(rc reconcile, header map[string][]string, body *answerBody, finished bool) (used int64, ok, stands bool) {
	c := rc.rule.cost
	switch {
	case body != nil && body.cut:
		g.metrics.streamsCut.WithLabelValues(rc.rule.name, "debt").Inc()
		return body.stream.Seen(c.from, header), true, false
	case body != nil && body.stream != nil && !finished:
		g.metrics.streamsCut.WithLabelValues(rc.rule.name, string(c.onCut)).Inc()
		if c.onCut != config.CutDeltas {
			return 0, false, true
		}
		return body.stream.Seen(c.from, header), true, false
	case body != nil && body.stream != nil:
		used, ok = body.stream.Cost(c.from, header)
		return used, ok, false
	}
	var b []byte
	if body != nil && body.keep && !body.over {
		b = body.b
	}
	used, ok = cost.FromResponse(c.from, header, b)
	return used, ok, false
}
