package queue

import (
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

// readEnvelope fills j from meta when meta is a document as appendEnvelope writes it: its
// fields in its order, no whitespace, strings with only the escapes it writes, times in
// canonical RFC 3339 (what time.Time's AppendFormat with RFC3339Nano writes), headers as valid
// UTF-8. It reports false for anything else, leaving the document to encoding/json
// (header_b64 included), and never accepts a document encoding/json would read differently
// (FuzzReadEnvelope). Strings without escapes are substrings of meta, not copies. Decoding the
// envelope was the worker's largest use of encoding/json (BenchmarkDecode).
func readEnvelope(meta string, j *Job) bool {
	r := envReader{s: meta}
	if !r.lit(`{"id":`) || !r.str(&j.ID) || !r.lit(`,"queue":`) || !r.str(&j.Queue) {
		return false
	}
	if r.lit(`,"method":`) && !r.str(&j.Method) {
		return false
	}
	if r.lit(`,"path":`) && !r.str(&j.Path) {
		return false
	}
	j.Direct = r.lit(`,"direct":true`)
	if r.lit(`,"header":`) && !r.header(&j.Header) {
		return false
	}
	if !r.lit(`,"created_at":`) || !r.time(&j.CreatedAt) {
		return false
	}
	return r.tail(j)
}

// tail reads the fields after created_at, to the end of the document.
func (r *envReader) tail(j *Job) bool {
	if r.lit(`,"idempotency_key":`) && !r.str(&j.IdempotencyKey) {
		return false
	}
	if r.lit(`,"ack_by":`) && !r.time(&j.AckBy) {
		return false
	}
	if r.lit(`,"tenant":`) && !r.str(&j.Tenant) {
		return false
	}
	if !r.costs(j) {
		return false
	}
	if r.lit(`,"not_before":`) && !r.time(&j.NotBefore) {
		return false
	}
	if r.lit(`,"priority":`) {
		var p string
		if !r.str(&p) {
			return false
		}
		j.Priority = Priority(p)
	}
	if r.lit(`,"trace":{"traceparent":`) {
		tc := &TraceContext{}
		if !r.str(&tc.Traceparent) || r.lit(`,"tracestate":`) && !r.str(&tc.Tracestate) || !r.lit("}") {
			return false
		}
		j.Trace = tc
	}
	return r.lit("}") && r.s == ""
}

// costs reads the cost and costs fields, where present.
func (r *envReader) costs(j *Job) bool {
	if r.lit(`,"cost":`) && !r.int(&j.Cost) {
		return false
	}
	return !r.lit(`,"costs":[`) || r.ints(&j.Costs)
}

// envReader reads the front of s.
type envReader struct{ s string }

// int consumes a JSON integer as strconv.AppendInt writes it (no leading zeros, no plus sign,
// no exponent) into dst.
func (r *envReader) int(dst *int64) bool {
	i := 0
	if i < len(r.s) && r.s[i] == '-' {
		i++
	}
	start := i
	for i < len(r.s) && r.s[i] >= '0' && r.s[i] <= '9' {
		i++
	}
	if i == start || (r.s[start] == '0' && i > start+1) || r.s[start:i] == "0" && start > 0 {
		return false
	}
	n, err := strconv.ParseInt(r.s[:i], 10, 64)
	if err != nil {
		return false
	}
	*dst, r.s = n, r.s[i:]
	return true
}

// ints consumes the rest of a non-empty JSON array of integers as appendEnvelope writes it
// (after its "["): integers as int reads them, separated by commas, then "]".
func (r *envReader) ints(dst *[]int64) bool {
	var out []int64
	for {
		var n int64
		if !r.int(&n) {
			return false
		}
		out = append(out, n)
		if r.lit("]") {
			*dst = out
			return true
		}
		if !r.lit(",") {
			return false
		}
	}
}

// lit consumes prefix when s starts with it.
func (r *envReader) lit(prefix string) bool {
	if !strings.HasPrefix(r.s, prefix) {
		return false
	}
	r.s = r.s[len(prefix):]
	return true
}

// str consumes a JSON string into dst: valid UTF-8 without control characters, with the
// escapes appendEnvelope writes (surrogate escapes, which it never writes, are refused). A
// string without escapes is a substring of the document.
func (r *envReader) str(dst *string) bool {
	if len(r.s) == 0 || r.s[0] != '"' {
		return false
	}
	i := 1
	for ; i < len(r.s) && r.s[i] != '"' && r.s[i] != '\\' && r.s[i] >= 0x20; i++ {
	}
	if i < len(r.s) && r.s[i] == '"' {
		v := r.s[1:i]
		if !utf8.ValidString(v) {
			return false
		}
		*dst, r.s = v, r.s[i+1:]
		return true
	}
	b := []byte(r.s[1:i])
	for i < len(r.s) {
		switch c := r.s[i]; {
		case c == '"':
			if !utf8.Valid(b) {
				return false
			}
			*dst, r.s = string(b), r.s[i+1:]
			return true
		case c < 0x20:
			return false
		case c != '\\':
			b = append(b, c)
			i++
			continue
		}
		var ok bool
		if b, i, ok = unescape(b, r.s, i); !ok {
			return false
		}
	}
	return false
}

// unescape appends to b the character of the escape at s[i:] and returns the index after
// it; false for an escape appendEnvelope does not write (surrogates included) or a cut one.
func unescape(b []byte, s string, i int) ([]byte, int, bool) {
	if i+1 >= len(s) {
		return b, i, false
	}
	switch e := s[i+1]; e {
	case '"', '\\', '/':
		b = append(b, e)
	case 'b':
		b = append(b, '\b')
	case 'f':
		b = append(b, '\f')
	case 'n':
		b = append(b, '\n')
	case 'r':
		b = append(b, '\r')
	case 't':
		b = append(b, '\t')
	case 'u':
		if i+6 > len(s) {
			return b, i, false
		}
		n, err := strconv.ParseUint(s[i+2:i+6], 16, 16)
		if err != nil || utf16.IsSurrogate(rune(n)) {
			return b, i, false
		}
		b = utf8.AppendRune(b, rune(n))
		i += 4
	default:
		return b, i, false
	}
	return b, i + 2, true
}

// time consumes a JSON string holding a time in canonical RFC 3339 form, without escapes
// (time.Time's UnmarshalJSON, which encoding/json calls, reads none).
func (r *envReader) time(dst *time.Time) bool {
	var s string
	rest := len(r.s)
	if !r.str(&s) || rest-len(r.s) != len(s)+2 {
		return false
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return false
	}
	var buf [len(time.RFC3339Nano) + 8]byte
	if string(t.AppendFormat(buf[:0], time.RFC3339Nano)) != s {
		return false // not canonical: encoding/json's stricter parser decides
	}
	*dst = t
	return true
}

// header consumes a JSON object of string arrays.
func (r *envReader) header(dst *http.Header) bool {
	h := make(http.Header, 8)
	if !r.lit("{") {
		return false
	}
	for first := true; !r.lit("}"); first = false {
		var k string
		if !first && !r.lit(",") || !r.str(&k) || !r.lit(":[") {
			return false
		}
		vs := make([]string, 0, 1)
		for i := 0; !r.lit("]"); i++ {
			var v string
			if i > 0 && !r.lit(",") || !r.str(&v) {
				return false
			}
			vs = append(vs, v)
		}
		h[k] = vs
	}
	*dst = h
	return true
}
