// Package cost reads what a request, a job or an upstream's answer costs in a policy's units
// (tokens, bytes, query cost), as a rule's or queue's cost and cost_from_response say
// (config.Cost): a header, a query parameter, the number at an RFC 6901 JSON pointer in a JSON
// body, the body's length, or a fixed number; or an expression of them: max(…), sum(…) or +,
// a whole factor, and prompt_tokens(json:<pointer>[, bytes per token]), a bound on the tokens
// of the text there (ceil(its size in bytes as sent / bytes per token), 0 when absent; see
// config.DefaultBytesPerToken for why 2 bytes a token does not under-charge common text).
//
// # Ambiguity
//
// Where the request can be read in several ways, the largest reading is charged: a header or
// query parameter given several times counts its largest value; JSON member names on a
// pointer's path match case folded, as encoding/json matches struct fields (Kelvin sign and
// long s included), and repeated or differently cased names all count; a number written as a
// string ("16000") is that number, as pydantic reads it. So no reading the upstream may make
// is charged less than Sluice charged.
//
// # Guarantees
//
// Reading never fails loudly and never makes a request free: a source that is missing or
// malformed (no such header, a body that is not JSON or has no number at the pointer, a
// negative, non-finite or too large number) reports ok false, and the caller charges its
// documented fallback; max(…) skips such operands while one can be read, and a sum fails with
// any of them. A number with a fraction is rounded up. A request's cost is at least 1;
// an answer's true cost may be 0 (everything charged is refunded).
//
// # Costs
//
// A header, query or fixed cost reads without allocating. A JSON pointer scans the body once,
// skipping what lies beside the path without decoding it (no encoding/json, no allocation
// unless a member name on the path holds escapes); it reads each object on the path to its end,
// since a name that appears twice there is malformed (parsers disagree on which one counts, and
// charging the one the upstream ignores would get around the limit).
package cost

import (
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/sluice-rl/sluice/internal/config"
)

// FromRequest reads c from a request: its header, its raw query, and its body (for json and
// body_bytes; body may be nil when c needs none). ok is false when the cost cannot be read; n
// is then 0. A read cost is at least 1. The zero Cost costs 1.
func FromRequest(c config.Cost, h http.Header, rawQuery string, body []byte) (n int64, ok bool) {
	if c.Kind == "" {
		return 1, true
	}
	if n, ok = eval(c, h, rawQuery, body); !ok {
		return 0, false
	}
	return max(n, 1), true
}

// FromResponse reads c, a cost_from_response, from an answer's header or body. ok is false when
// c is the zero Cost or the cost cannot be read. A true cost may be 0.
func FromResponse(c config.Cost, h http.Header, body []byte) (n int64, ok bool) {
	if c.Kind == "" {
		return 0, false
	}
	return eval(c, h, "", body)
}

// eval reads c: a source, or an expression of them. max reads what of its operands it can
// (at least one); sum and a factor need all of theirs. A result above config.MaxCost is
// config.MaxCost, which no policy admits at once.
func eval(c config.Cost, h http.Header, rawQuery string, body []byte) (int64, bool) {
	switch c.Kind {
	case config.CostNumber:
		return c.N, true
	case config.CostBodyBytes:
		return int64(len(body)), true
	case config.CostHeader:
		return headerNumber(h, c.Name)
	case config.CostQuery:
		return queryNumber(rawQuery, c.Name)
	case config.CostJSON:
		return Pointer(body, c.Name)
	case config.CostPromptTokens:
		if c.Encoding != "" {
			return Tokens(body, c.Name, c.Encoding)
		}
		n, ok := Size(body, c.Name)
		if !ok {
			return 0, false
		}
		return (n + c.N - 1) / c.N, true
	case config.CostMax:
		var most int64
		read := false
		for _, a := range c.Args {
			if n, ok := eval(a, h, rawQuery, body); ok {
				most, read = max(most, n), true
			}
		}
		return most, read
	case config.CostSum:
		var sum int64
		for _, a := range c.Args {
			n, ok := eval(a, h, rawQuery, body)
			if !ok {
				return 0, false
			}
			sum = min(sum+n, config.MaxCost)
		}
		return sum, true
	case config.CostScaled:
		n, ok := eval(c.Args[0], h, rawQuery, body)
		if !ok {
			return 0, false
		}
		if n > config.MaxCost/c.N {
			return config.MaxCost, true
		}
		return n * c.N, true
	}
	return 0, false
}

// headerNumber reads the header name (canonical) as a number. A header sent several times is
// ambiguous (servers differ on which value they read: the first, the last, or all joined):
// it is charged its largest value, and ok is false if any value is malformed.
func headerNumber(h http.Header, name string) (n int64, ok bool) {
	vs := h[name]
	for _, v := range vs {
		k, good := number(v)
		if !good {
			return 0, false
		}
		n = max(n, k)
	}
	return n, len(vs) > 0
}

// queryNumber reads the query parameter name in rawQuery, unescaped, as a number. A parameter
// given several times (?limit=1&limit=60) is ambiguous (Django, PHP and Rails read the last,
// Go and Express the first or all): it is charged its largest value, and ok is false if any
// value is malformed.
func queryNumber(rawQuery, name string) (n int64, ok bool) {
	found := false
	for rawQuery != "" {
		var kv string
		kv, rawQuery, _ = strings.Cut(rawQuery, "&")
		k, v, _ := strings.Cut(kv, "=")
		if k != name {
			if uk, err := url.QueryUnescape(k); err != nil || uk != name {
				continue
			}
		}
		u, err := url.QueryUnescape(v)
		if err != nil {
			return 0, false
		}
		k2, good := number(u)
		if !good {
			return 0, false
		}
		n, found = max(n, k2), true
	}
	return n, found
}

// number parses a cost written as a decimal number: at least 0, at most config.MaxCost, a
// fraction rounded up.
func number(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 || n > config.MaxCost {
			return 0, false
		}
		return n, true
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || f < 0 || f > config.MaxCost {
		return 0, false
	}
	return int64(math.Ceil(f)), true
}
