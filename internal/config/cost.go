package config

import (
	"fmt"
	"net/textproto"
	"strconv"
	"strings"
)

// CostKind is where a request's or job's cost is read from.
type CostKind string

// The cost sources, as the file names them before the colon.
const (
	// CostNumber is a fixed cost: the same for every request (Cost.N).
	CostNumber CostKind = "number"
	// CostHeader reads a request header (or, in cost_from_response, a response header) holding
	// a number.
	CostHeader CostKind = "header"
	// CostQuery reads a query parameter holding a number.
	CostQuery CostKind = "query"
	// CostJSON reads the number at an RFC 6901 JSON pointer in a JSON body.
	CostJSON CostKind = "json"
	// CostBodyBytes is the length of the body in bytes.
	CostBodyBytes CostKind = "body_bytes"
	// CostMax is the largest of Args that can be read (max(a, b, …)).
	CostMax CostKind = "max"
	// CostSum is the sum of Args, each of which must be read (sum(a, b, …), or a + b).
	CostSum CostKind = "sum"
	// CostScaled is N × Args[0] (N * a, or a * N).
	CostScaled CostKind = "scaled"
	// CostPromptTokens is a bound on the tokens of the text at the JSON pointer Name:
	// ceil(bytes / N), the size of the value as sent over N bytes per token (default
	// DefaultBytesPerToken); or, with Encoding, the tokens of its strings counted by that
	// tokenizer (internal/cost says how); 0 when the pointer names nothing
	// (prompt_tokens(json:/messages), prompt_tokens(json:/messages, 1),
	// prompt_tokens(json:/messages, o200k)).
	CostPromptTokens CostKind = "prompt_tokens"
)

// DefaultBytesPerToken is the bytes per token prompt_tokens assumes unless told: 2, half what
// the common tokenizers average on English and code (about 4 bytes a token for OpenAI's
// cl100k and o200k, Llama 3's and Mistral's) and no more than they average on CJK text (about
// 3 bytes a UTF-8 character, at most one token each), counting the JSON around the text too.
// Contrived text can reach 1 token a byte; prompt_tokens(…, 1) never under-charges a
// byte-level tokenizer, and reconciliation charges what the answer reports either way.
const DefaultBytesPerToken = 2

// MaxReadAhead is the most of one request's body the ingress reads ahead to find a cost in it
// (cost: json:…, or body_bytes without a Content-Length): a larger body is charged the
// fallback. It holds MaxReadAhead + 1 bytes at most, to tell a body of exactly this size.
const MaxReadAhead = 1 << 20

// MaxCost is the largest cost Sluice reads from a request, a job or an answer: larger values
// are malformed (and take the fallback). It keeps every charge exact in the stores' integer
// arithmetic.
const MaxCost = 1 << 40

// Cost says how many units a request or a job costs (YAML cost, cost_from_response). The zero
// value costs 1 and is read from nothing.
type Cost struct {
	// Kind is the source; "" for the default cost of 1.
	Kind CostKind
	// Name is the header or query parameter name (CostHeader, CostQuery; a header's in
	// canonical form) or the JSON pointer (CostJSON).
	Name string
	// N is the cost of CostNumber, the factor of CostScaled, the bytes per token of
	// CostPromptTokens.
	N int64
	// Args are the operands of CostMax, CostSum and CostScaled.
	Args []Cost
	// Encoding is the tokenizer of CostPromptTokens, "" for the bytes bound: one of
	// Encodings.
	Encoding string
}

// Encodings are the tokenizers prompt_tokens may count with: OpenAI's, as
// github.com/tiktoken-go/tokenizer embeds them (o200k for GPT-4o, GPT-4.1, GPT-5 and the o
// series; cl100k for GPT-4 and GPT-3.5).
var Encodings = []string{"o200k", "cl100k"}

// IsSet reports whether the cost is read from somewhere (or fixed), not the default of 1.
func (c Cost) IsSet() bool { return c.Kind != "" }

// String formats the cost as the file writes it.
func (c Cost) String() string {
	switch c.Kind {
	case "":
		return "1"
	case CostNumber:
		return strconv.FormatInt(c.N, 10)
	case CostBodyBytes:
		return string(c.Kind)
	case CostMax, CostSum:
		args := make([]string, len(c.Args))
		for i, a := range c.Args {
			args[i] = a.String()
		}
		return string(c.Kind) + "(" + strings.Join(args, ", ") + ")"
	case CostScaled:
		return strconv.FormatInt(c.N, 10) + " * " + c.Args[0].String()
	case CostPromptTokens:
		if c.Encoding != "" {
			return fmt.Sprintf("prompt_tokens(json:%s, %s)", c.Name, c.Encoding)
		}
		return fmt.Sprintf("prompt_tokens(json:%s, %d)", c.Name, c.N)
	}
	return string(c.Kind) + ":" + c.Name
}

// Reads reports whether c reads any source for which has: the kinds of its leaves.
func (c Cost) Reads(has func(CostKind) bool) bool {
	if has(c.Kind) {
		return true
	}
	for _, a := range c.Args {
		if a.Reads(has) {
			return true
		}
	}
	return false
}

// IsExpr reports whether c combines sources (max, sum, a factor, prompt_tokens).
func (c Cost) IsExpr() bool {
	switch c.Kind {
	case CostMax, CostSum, CostScaled, CostPromptTokens:
		return true
	}
	return false
}

// ParseCost parses a cost as the file writes it: header:NAME, query:NAME, json:<pointer>,
// body_bytes or a whole number from 1 to MaxCost, or an expression of them (parseExpr):
// max(a, b, …), sum(a, b, …), a + b, N * a, prompt_tokens(json:<pointer>[, bytes per token]).
// response restricts it to what an answer has: header:NAME or json:<pointer>, and sums,
// maxima and factors of them.
func ParseCost(s string, response bool) (Cost, error) {
	s = strings.TrimSpace(s)
	if strings.ContainsAny(s, "(+*") {
		c, err := parseExpr(s, response)
		if err == nil {
			return c, nil
		}
		if _, serr := parseSource(s, response); serr != nil || strings.ContainsAny(s, " \t") {
			return Cost{}, err // no source either (a pointer in one word): the expression's error says more
		}
	}
	return parseSource(s, response)
}

// parseSource parses one source, or a fixed number.
func parseSource(s string, response bool) (Cost, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && !response {
		if n < 1 || n > MaxCost {
			return Cost{}, fmt.Errorf("a fixed cost must be between 1 and %d, got %d", int64(MaxCost), n)
		}
		return Cost{Kind: CostNumber, N: n}, nil
	}
	want := "want header:NAME, query:NAME, json:<JSON pointer>, body_bytes or a number"
	if response {
		want = "want header:NAME or json:<JSON pointer> (what the upstream's answer carries)"
	}
	kind, arg, hasArg := strings.Cut(s, ":")
	c := Cost{Kind: CostKind(kind), Name: arg}
	switch c.Kind {
	case CostHeader:
		if !isToken(arg) {
			return Cost{}, fmt.Errorf("%q: header:NAME needs a valid header name", s)
		}
		c.Name = textproto.CanonicalMIMEHeaderKey(arg)
	case CostQuery:
		if response {
			return Cost{}, fmt.Errorf("%q: %s", s, want)
		}
		if arg == "" {
			return Cost{}, fmt.Errorf("%q: query:NAME needs a parameter name", s)
		}
	case CostJSON:
		if err := checkPointer(arg); err != nil {
			return Cost{}, fmt.Errorf("%q: %v", s, err)
		}
	case CostBodyBytes:
		if response || hasArg {
			return Cost{}, fmt.Errorf("%q: %s", s, want)
		}
	default:
		return Cost{}, fmt.Errorf("%q: %s", s, want)
	}
	return c, nil
}

// checkPointer reports why p is not a JSON pointer (RFC 6901) to a member, or nil.
func checkPointer(p string) error {
	if p == "" || p[0] != '/' {
		return fmt.Errorf("a JSON pointer starts with / (json:/usage/total_tokens)")
	}
	for i := 0; i < len(p); i++ {
		if p[i] == '~' && (i+1 == len(p) || (p[i+1] != '0' && p[i+1] != '1')) {
			return fmt.Errorf("~ in a JSON pointer must be followed by 0 or 1 (~0 is ~, ~1 is /)")
		}
	}
	return nil
}

// cost reads a cost field; nil is the zero Cost.
func (b *builder) cost(where, field string, v *scalar, response bool) Cost {
	if v == nil {
		return Cost{}
	}
	s := b.text(where, field, v, "")
	if v.shape != "" {
		return Cost{}
	}
	c, err := ParseCost(s, response)
	if err != nil {
		b.p.addf(where, field, "%s: %v", field, err)
	}
	return c
}

// ruleCost reads a rule's cost, cost_fallback and cost_from_response: they need a rule that
// charges a limit per period.
func (b *builder) ruleCost(where string, r *Rule, rr rawRule) {
	r.Cost = b.cost(where, "cost", rr.Cost, false)
	r.CostFromResponse = b.cost(where, "cost_from_response", rr.CostFromResponse, true)
	r.CostFallback = b.integer(where, "cost_fallback", rr.CostFallback, 0, 64)
	r.CostOnCut = b.cutCharge(where, rr.CostOnCut, r.CostFromResponse.IsSet())
	r.CutOnDebt = b.integer(where, "cut_on_debt", rr.CutOnDebt, 0, 64)
	if rr.CutOnDebt != nil {
		b.bound(where, "cut_on_debt", r.CutOnDebt, 1, MaxCost)
		if !r.CostFromResponse.IsSet() {
			b.p.add(where, "cut_on_debt", "cut_on_debt ends a streamed answer that owes more than it was charged: it needs cost_from_response")
		}
	}
	if !r.Cost.IsSet() && !r.CostFromResponse.IsSet() && rr.CostFallback == nil {
		return
	}
	switch {
	case r.Concurrency():
		b.p.add(where, "cost", "cost does not apply to algorithm: concurrency (it counts requests in flight)")
		return
	case !r.HasLimit():
		b.p.add(where, "cost", "cost needs a limit (algorithm, limit and period) to charge")
		return
	case r.Lease > 0:
		b.p.add(where, "lease", "lease takes requests ahead one unit each; it does not apply to a rule with a cost")
	case r.CostFromResponse.IsSet() && r.Algorithm == "sliding_log":
		b.p.add(where, "cost_from_response", "cost_from_response needs an algorithm that carries debt: sliding_log keeps one entry per unit within one period and would drop what the answer owes beyond it; use sliding_window")
	}
	capacity := r.LimitSpec().Capacity()
	if r.Cost.Kind == CostNumber && r.Cost.N > capacity {
		b.p.addf(where, "cost", "cost %d exceeds what the limit can ever admit at once (%d)", r.Cost.N, capacity)
	}
	if rr.CostFallback != nil {
		b.bound(where, "cost_fallback", r.CostFallback, 1, capacity)
		if !r.Cost.IsSet() || r.Cost.Kind == CostNumber {
			b.p.add(where, "cost_fallback", "cost_fallback applies to a cost read from the request (header, query, json or body_bytes)")
		}
	}
}

// cutCharge reads cost_on_cut: estimate (the default) or deltas, and only with
// cost_from_response (fromResponse).
func (b *builder) cutCharge(where string, v *scalar, fromResponse bool) CutCharge {
	if v == nil {
		return ""
	}
	m := CutCharge(b.text(where, "cost_on_cut", v, string(CutEstimate)))
	switch {
	case m != CutEstimate && m != CutDeltas:
		b.p.addf(where, "cost_on_cut", "cost_on_cut: invalid value %q: want estimate or deltas", m)
	case !fromResponse:
		b.p.add(where, "cost_on_cut", "cost_on_cut says what a streamed answer cut short is charged: it needs cost_from_response")
	}
	return m
}

// queueCost reads a queue's cost, cost_fallback, cost_rate, cost_burst and cost_from_response:
// the first and the last need cost_rate.
func (b *builder) queueCost(where string, q *Queue, r *rawQueue) {
	q.Cost = b.cost(where, "cost", r.Cost, false)
	q.CostFromResponse = b.cost(where, "cost_from_response", r.CostFromResponse, true)
	if r.CostRate != nil {
		s := b.text(where, "cost_rate", r.CostRate, "")
		if rate, err := ParseRate(s); err != nil {
			b.p.addf(where, "cost_rate", "cost_rate: %v", err)
		} else {
			q.CostRate = rate
		}
	}
	q.CostBurst = b.integer(where, "cost_burst", r.CostBurst, 0, 64)
	b.bound(where, "cost_burst", q.CostBurst, 0, MaxCost)
	q.CostFallback = b.integer(where, "cost_fallback", r.CostFallback, 0, 64)
	if r.CostRate == nil {
		for _, f := range []struct {
			name string
			v    *scalar
		}{{"cost", r.Cost}, {"cost_burst", r.CostBurst}, {"cost_fallback", r.CostFallback}, {"cost_from_response", r.CostFromResponse}} {
			if f.v != nil {
				b.p.addf(where, f.name, "%s needs cost_rate, the units per period the queue drains", f.name)
			}
		}
		return
	}
	capacity := q.CostCapacity()
	if q.Cost.Kind == CostNumber && q.Cost.N > capacity {
		b.p.addf(where, "cost", "cost %d exceeds what cost_rate and cost_burst can ever deliver at once (%d)", q.Cost.N, capacity)
	}
	if r.CostFallback != nil {
		b.bound(where, "cost_fallback", q.CostFallback, 1, capacity)
		if !q.Cost.IsSet() || q.Cost.Kind == CostNumber {
			b.p.add(where, "cost_fallback", "cost_fallback applies to a cost read from the request (header, query, json or body_bytes)")
		}
	}
}

// CostCapacity is the largest cost one job of the queue may have: the units its cost_rate
// allows in one period, or cost_burst if that is larger. 0 without cost_rate.
func (q *Queue) CostCapacity() int64 { return max(q.CostRate.N, q.CostBurst) }

// Fallback is the cost charged when the cost cannot be read from a request (a header or
// parameter missing, a body that is not JSON or has no number at the pointer, a negative or
// too large number): the rule's or queue's cost_fallback when set, else capacity — the most
// the policy admits at once, so a request that says nothing of its cost is never cheaper
// than one that says the most.
func Fallback(fallback, capacity int64) int64 {
	if fallback > 0 {
		return fallback
	}
	return capacity
}
