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
// JSON document doc, read as number reads it; a string holding a number counts as that number. ok is false when doc is not JSON up to the value,
// the pointer names nothing, or the value is not a number in range.
func Pointer(doc []byte, ptr string) (int64, bool) {
	s := scanner{b: doc}
	for ptr != "" {
		if ptr[0] != '/' {
			return 0, false
		}
		ptr = ptr[1:]
		tok := ptr
		if i := strings.IndexByte(ptr, '/'); i >= 0 {
			tok, ptr = ptr[:i], ptr[i:]
		} else {
			ptr = ""
		}
		if !s.enter(unescapeToken(tok)) {
			return 0, false
		}
	}
	s.space()
	start := s.i
	if s.peek() == '"' {
		// A number in a string ("16000"): pydantic, which vLLM and other OpenAI-compatible
		// servers use, reads it as the number, so it is charged as that number.
		n, ok := s.skipStr()
		if !ok {
			return 0, false
		}
		v, ok := unquote(s.b[start+1 : start+n-1])
		if !ok {
			return 0, false
		}
		return number(v)
	}
	if !s.number() {
		return 0, false
	}
	return number(string(s.b[start:s.i]))
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
	b []byte
	i int
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

// enter moves into the member tok of the object, or the element tok of the array, that starts
// at the scanner, leaving it before that value.
func (s *scanner) enter(tok string) bool {
	switch s.peek() {
	case '{':
		return s.member(tok)
	case '[':
		return s.element(tok)
	}
	return false
}

// member enters the member tok of the object at the scanner. Every member is read: a name on
// the path that appears twice is malformed, since parsers disagree on which one counts (most
// take the last, some the first), and charging the one the upstream ignores would be a way
// around the limit.
func (s *scanner) member(tok string) bool {
	s.i++
	at := -1
	for first := true; ; first = false {
		c := s.peek()
		if c == '}' {
			s.i = at
			return at >= 0
		}
		if !first {
			if c != ',' {
				return false
			}
			s.i++
			s.space()
		}
		match, ok := s.name(tok)
		if !ok || s.peek() != ':' {
			return false
		}
		s.i++
		if match {
			if at >= 0 {
				return false
			}
			s.space()
			at = s.i
		}
		if !s.skip(0) {
			return false
		}
	}
}

// element enters the element tok of the array at the scanner.
func (s *scanner) element(tok string) bool {
	n, err := strconv.Atoi(tok)
	if err != nil || tok[0] < '0' || tok[0] > '9' || (len(tok) > 1 && tok[0] == '0') {
		return false
	}
	s.i++
	for k := 0; ; k++ {
		c := s.peek()
		if c == ']' {
			return false
		}
		if k > 0 {
			if c != ',' {
				return false
			}
			s.i++
		}
		if k == n {
			return true
		}
		if !s.skip(0) {
			return false
		}
	}
}

// name reads a member name at the scanner and reports whether it is tok; a name with escapes
// is decoded to compare (the only allocation of a scan).
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
				return string(raw) == tok, true
			}
			v, ok := unquote(raw)
			return ok && v == tok, ok
		case c == '\\':
			escaped = true
			j++
		case c < 0x20:
			return false, false
		}
	}
	return false, false
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
