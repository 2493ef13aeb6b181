package cost

import (
	"bytes"
	"strconv"
	"strings"
	"unicode/utf8"
)

// maxDepth bounds the nesting a skipped value may have, so a hostile body cannot make the scan
// recurse without end; deeper documents are malformed.
const maxDepth = 1000

// Pointer returns the number at the RFC 6901 JSON pointer ptr ("/usage/total_tokens") in the
// JSON document doc, read as number reads it; a string holding a number counts as that number
// (pydantic, which vLLM and other OpenAI-compatible servers use, reads "16000" as 16000).
//
// A member name on the path matches the pointer's token as encoding/json matches a struct
// field: case folded (so "MAX_TOKENS", and "max_to\u212aens" with the Kelvin sign, are
// max_tokens too), and a name may appear several times. Where several members match, parsers
// disagree on which one counts (the first, the last, the exact spelling), so the value is the
// largest of theirs, and every one of them must hold a number. ok is false when doc is not
// JSON up to the value, the pointer names nothing, or a value it names is not a number in
// range.
func Pointer(doc []byte, ptr string) (int64, bool) {
	n, st := walk(doc, ptr, nil)
	return n, st == found
}

// Size returns the size in bytes, as written, of the value at the JSON pointer ptr in doc,
// the largest where several members match (as Pointer matches them), and 0 when the pointer
// names nothing. ok is false when doc is not JSON as far as the scan reads it: the whole
// objects and arrays on the path, and the values it measures.
func Size(doc []byte, ptr string) (int64, bool) {
	n, st := walk(doc, ptr, func(raw []byte) int64 { return int64(len(raw)) })
	return n, st != bad
}

// status is what a scan found at a pointer.
type status uint8

const (
	found   status = iota // a value, well formed
	missing               // nothing at the pointer, in a document well formed as far as read
	bad                   // not JSON as far as read, or (numbers) a value that is no number
)

// walk scans doc for the value at ptr: its number, or with measure what measure makes of it
// (as written, whole and well formed).
func walk(doc []byte, ptr string, measure func(raw []byte) int64) (int64, status) {
	var toks [8]string
	path := toks[:0]
	for ptr != "" {
		if ptr[0] != '/' {
			return 0, bad
		}
		ptr = ptr[1:]
		tok := ptr
		if i := strings.IndexByte(ptr, '/'); i >= 0 {
			tok, ptr = ptr[:i], ptr[i:]
		} else {
			ptr = ""
		}
		path = append(path, unescapeToken(tok))
	}
	s := scanner{b: doc, measure: measure}
	return s.value(path)
}

// unescapeToken undoes a reference token's escapes: ~1 is /, ~0 is ~.
func unescapeToken(tok string) string {
	if !strings.Contains(tok, "~") {
		return tok
	}
	return strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
}

// scanner reads a JSON document from b[i:].
type scanner struct {
	b       []byte
	i       int
	measure func(raw []byte) int64 // measure the values at the path, rather than read numbers
}

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek is the next byte after white space, or 0 at the end.
func (s *scanner) peek() byte {
	s.space()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// value reads the value at the scanner and returns what is at path in it (see Pointer and
// Size), leaving the scanner past the value unless the status is bad.
func (s *scanner) value(path []string) (int64, status) {
	if len(path) == 0 {
		return s.leaf()
	}
	switch s.peek() {
	case '{':
		return s.members(path)
	case '[':
		return s.element(path)
	}
	if !s.skip(0) {
		return 0, bad
	}
	return 0, missing // a path into a string, a number or a literal
}

// leaf reads the value the path names: its number, or its size.
func (s *scanner) leaf() (int64, status) {
	s.space()
	start := s.i
	if s.measure != nil {
		if !s.skip(0) {
			return 0, bad
		}
		return s.measure(s.b[start:s.i]), found
	}
	if s.i < len(s.b) && s.b[s.i] == '"' {
		n, ok := s.skipStr()
		if !ok {
			return 0, bad
		}
		v, ok := unquote(s.b[start+1 : start+n-1])
		if !ok {
			return 0, bad
		}
		return numberStatus(v)
	}
	if !s.number() {
		return 0, bad
	}
	return numberStatus(string(s.b[start:s.i]))
}

func numberStatus(v string) (int64, status) {
	if n, ok := number(v); ok {
		return n, found
	}
	return 0, bad
}

// members reads the object at the scanner to its end, and returns the largest of what is at
// path[1:] in the members whose names match path[0] (see Pointer). Reading numbers, a match
// that holds none makes the whole missing (or bad); measuring, it counts nothing.
func (s *scanner) members(path []string) (int64, status) {
	s.i++
	var most int64
	st := missing
	lacks := false
	for first := true; ; first = false {
		c := s.peek()
		if c == '}' {
			s.i++
			if lacks {
				return 0, missing
			}
			return most, st
		}
		if !first {
			if c != ',' {
				return 0, bad
			}
			s.i++
			s.space()
		}
		match, ok := s.name(path[0])
		if !ok || s.peek() != ':' {
			return 0, bad
		}
		s.i++
		if !match {
			if !s.skip(0) {
				return 0, bad
			}
			continue
		}
		switch n, got := s.value(path[1:]); got {
		case bad:
			return 0, bad
		case missing:
			lacks = lacks || s.measure == nil
		default:
			most, st = max(most, n), found
		}
	}
}

// element reads the array at the scanner to its end, and returns what is at path[1:] in its
// element path[0].
func (s *scanner) element(path []string) (int64, status) {
	tok := path[0]
	want, err := strconv.Atoi(tok)
	if err != nil || tok[0] < '0' || tok[0] > '9' || (len(tok) > 1 && tok[0] == '0') {
		want = -1 // names no element
	}
	s.i++
	var n int64
	st := missing
	for k := 0; ; k++ {
		c := s.peek()
		if c == ']' {
			s.i++
			return n, st
		}
		if k > 0 {
			if c != ',' {
				return 0, bad
			}
			s.i++
		}
		if k == want {
			if n, st = s.value(path[1:]); st == bad {
				return 0, bad
			}
			continue
		}
		if !s.skip(0) {
			return 0, bad
		}
	}
}

// name reads a member name at the scanner and reports whether it is tok, case folded as
// encoding/json folds them; a name with escapes is decoded to compare (the only allocation of
// a scan).
func (s *scanner) name(tok string) (match, ok bool) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return false, false
	}
	start := s.i + 1
	escaped := false
	for j := start; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			s.i = j + 1
			raw := s.b[start:j]
			if !escaped {
				return foldEqual(raw, tok), true
			}
			v, ok := unquote(raw)
			return ok && strings.EqualFold(v, tok), ok
		case c == '\\':
			escaped = true
			j++
		case c < 0x20:
			return false, false
		}
	}
	return false, false
}

// foldEqual is strings.EqualFold(string(raw), tok) without the conversion's allocation.
func foldEqual(raw []byte, tok string) bool {
	if len(raw) == len(tok) && string(raw) == tok {
		return true
	}
	return bytes.EqualFold(raw, []byte(tok))
}

// unquote decodes the escapes of a JSON string's contents.
func unquote(raw []byte) (string, bool) {
	v, err := strconv.Unquote(`"` + strings.ReplaceAll(string(raw), `\/`, `/`) + `"`)
	if err != nil || !utf8.ValidString(v) {
		return "", false
	}
	return v, true
}

// skip moves past the value at the scanner.
func (s *scanner) skip(depth int) bool {
	if depth > maxDepth {
		return false
	}
	switch c := s.peek(); c {
	case '"':
		_, ok := s.skipStr()
		return ok
	case '{', '[':
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		s.i++
		for first := true; ; first = false {
			if s.peek() == end {
				s.i++
				return true
			}
			if !first {
				if s.peek() != ',' {
					return false
				}
				s.i++
			}
			if c == '{' {
				s.space()
				if _, ok := s.skipStr(); !ok || s.peek() != ':' {
					return false
				}
				s.i++
			}
			if !s.skip(depth + 1) {
				return false
			}
		}
	case 't':
		return s.lit("true")
	case 'f':
		return s.lit("false")
	case 'n':
		return s.lit("null")
	}
	return s.number()
}

// skipStr moves past a string without decoding it.
func (s *scanner) skipStr() (int, bool) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return 0, false
	}
	for j := s.i + 1; j < len(s.b); j++ {
		switch s.b[j] {
		case '"':
			n := j + 1 - s.i
			s.i = j + 1
			return n, true
		case '\\':
			j++
		}
	}
	return 0, false
}

func (s *scanner) lit(word string) bool {
	if !bytes.HasPrefix(s.b[s.i:], []byte(word)) {
		return false
	}
	s.i += len(word)
	return true
}

// number moves past a JSON number (RFC 8259 grammar).
func (s *scanner) number() bool {
	start := s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	digits := func() int {
		n := 0
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	intStart := s.i
	if n := digits(); n == 0 || (n > 1 && s.b[intStart] == '0') {
		s.i = start
		return false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			s.i = start
			return false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if digits() == 0 {
			s.i = start
			return false
		}
	}
	return true
}
