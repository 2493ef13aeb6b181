package retry

import (
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
)

// A minimal parser for Structured Field Lists (RFC 9651, section 4.2.1), enough for the
// RateLimit and RateLimit-Policy fields. As the RFC requires, a syntax error anywhere fails
// the whole field; callers then ignore the field.

// sfItem is one member of a list: a bare item with its parameters. Inner lists are parsed
// (so that a valid list containing one is not rejected) and flagged.
type sfItem struct {
	value  any // int64, float64, string, sfToken, []byte, bool; nil for an inner list
	inner  bool
	params []sfParam
}

type sfToken string

type sfParam struct {
	key   string
	value any
}

// param returns the value of parameter key (the last one wins, per RFC 9651 4.2.3.2).
func (it sfItem) param(key string) (any, bool) {
	for i := len(it.params) - 1; i >= 0; i-- {
		if it.params[i].key == key {
			return it.params[i].value, true
		}
	}
	return nil, false
}

var errSF = errors.New("retry: malformed structured field")

type sfParser struct {
	s string
	i int
}

// parseSFList parses the combined field value (several field lines joined with ",").
func parseSFList(v string) ([]sfItem, error) {
	p := &sfParser{s: strings.Trim(v, " \t")}
	var items []sfItem
	for p.i < len(p.s) {
		var it sfItem
		var err error
		if p.peek() == '(' {
			it, err = p.innerList()
		} else {
			it, err = p.item()
		}
		if err != nil {
			return nil, err
		}
		items = append(items, it)
		p.ows()
		if p.i == len(p.s) {
			return items, nil
		}
		if p.s[p.i] != ',' {
			return nil, errSF
		}
		p.i++
		p.ows()
		if p.i == len(p.s) {
			return nil, errSF // trailing comma
		}
	}
	return items, nil
}

func (p *sfParser) peek() byte {
	if p.i < len(p.s) {
		return p.s[p.i]
	}
	return 0
}

func (p *sfParser) ows() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *sfParser) item() (sfItem, error) {
	v, err := p.bareItem()
	if err != nil {
		return sfItem{}, err
	}
	params, err := p.params()
	return sfItem{value: v, params: params}, err
}

func (p *sfParser) innerList() (sfItem, error) {
	p.i++ // (
	for {
		for p.peek() == ' ' {
			p.i++
		}
		if p.i >= len(p.s) {
			return sfItem{}, errSF
		}
		if p.s[p.i] == ')' {
			p.i++
			params, err := p.params()
			return sfItem{inner: true, params: params}, err
		}
		if _, err := p.item(); err != nil {
			return sfItem{}, err
		}
		if c := p.peek(); c != ' ' && c != ')' {
			return sfItem{}, errSF
		}
	}
}

func (p *sfParser) params() ([]sfParam, error) {
	var params []sfParam
	for p.peek() == ';' {
		p.i++
		for p.peek() == ' ' {
			p.i++
		}
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		var v any = true
		if p.peek() == '=' {
			p.i++
			if v, err = p.bareItem(); err != nil {
				return nil, err
			}
		}
		params = append(params, sfParam{key: key, value: v})
	}
	return params, nil
}

func (p *sfParser) key() (string, error) {
	start := p.i
	if c := p.peek(); !(c >= 'a' && c <= 'z' || c == '*') {
		return "", errSF
	}
	for p.i < len(p.s) {
		c := p.s[p.i]
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.' || c == '*' {
			p.i++
			continue
		}
		break
	}
	return p.s[start:p.i], nil
}

func (p *sfParser) bareItem() (any, error) {
	c := p.peek()
	switch {
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	case c == '"':
		return p.str()
	case c == '*' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
		return p.token()
	case c == ':':
		return p.binary()
	case c == '?':
		return p.boolean()
	case c == '@': // RFC 9651 Date: an integer number of seconds since the epoch.
		p.i++
		v, err := p.number()
		if _, ok := v.(int64); err != nil || !ok {
			return nil, errSF
		}
		return v, nil
	}
	return nil, errSF
}

func (p *sfParser) number() (any, error) {
	start := p.i
	if p.peek() == '-' {
		p.i++
	}
	digits, dot, frac := 0, -1, 0
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c >= '0' && c <= '9':
			if dot >= 0 {
				frac++
			} else {
				digits++
			}
		case c == '.' && dot < 0 && digits > 0:
			dot = p.i
		default:
			goto done
		}
		p.i++
	}
done:
	if digits == 0 {
		return nil, errSF
	}
	text := p.s[start:p.i]
	if dot < 0 {
		if digits > 15 {
			return nil, errSF
		}
		return strconv.ParseInt(text, 10, 64)
	}
	if digits > 12 || frac == 0 || frac > 3 {
		return nil, errSF
	}
	return strconv.ParseFloat(text, 64)
}

func (p *sfParser) str() (any, error) {
	p.i++ // "
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.i >= len(p.s) || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
				return nil, errSF
			}
			b.WriteByte(p.s[p.i])
			p.i++
		case c == '"':
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return nil, errSF
		default:
			b.WriteByte(c)
		}
	}
	return nil, errSF // unterminated
}

func (p *sfParser) token() (any, error) {
	start := p.i
	p.i++
	for p.i < len(p.s) && isTokenChar(p.s[p.i]) {
		p.i++
	}
	return sfToken(p.s[start:p.i]), nil
}

// isTokenChar reports whether c may appear in a Structured Fields token: a tchar, ":" or "/".
func isTokenChar(c byte) bool { return IsTokenChar(c) || c == ':' || c == '/' }

// IsTokenChar reports whether c may appear in an HTTP token (RFC 9110 section 5.6.2, tchar):
// the characters of a method or a header name. It is the one such check of the module.
func IsTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// IsToken reports whether s is a non-empty HTTP token (RFC 9110 section 5.6.2).
func IsToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !IsTokenChar(s[i]) {
			return false
		}
	}
	return true
}

func (p *sfParser) binary() (any, error) {
	p.i++ // :
	end := strings.IndexByte(p.s[p.i:], ':')
	if end < 0 {
		return nil, errSF
	}
	b, err := base64.StdEncoding.DecodeString(p.s[p.i : p.i+end])
	if err != nil {
		return nil, errSF
	}
	p.i += end + 1
	return b, nil
}

func (p *sfParser) boolean() (any, error) {
	if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
		v := p.s[p.i+1] == '1'
		p.i += 2
		return v, nil
	}
	return nil, errSF
}
