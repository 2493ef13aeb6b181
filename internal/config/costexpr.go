package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// An expression combines sources into one cost, so that a request can be charged a bound on
// what it will really cost (a prompt estimate plus its completion bound):
//
//	expr   = term { "+" term }
//	term   = atom [ "*" atom ]             one of the two a whole number: a factor
//	atom   = NUMBER | source | "(" expr ")"
//	       | "max(" expr { "," expr } ")" | "sum(" expr { "," expr } ")"
//	       | "prompt_tokens(" "json:" POINTER [ "," NUMBER | ENCODING ] ")"
//	source = header:NAME | query:NAME | json:POINTER | body_bytes
//
// Inside an expression a source ends at a space, a comma, a parenthesis, "+" or "*".

// maxExprArgs bounds the operands of one max or sum, and maxExprDepth the nesting, so that a
// cost stays cheap to read.
const (
	maxExprArgs  = 16
	maxExprDepth = 8
)

// exprParser reads an expression from s[i:].
type exprParser struct {
	s        string
	i        int
	response bool
	depth    int
}

// parseExpr parses an expression (see above); response allows only what an answer carries.
func parseExpr(s string, response bool) (Cost, error) {
	p := &exprParser{s: s, response: response}
	c, err := p.expr()
	if err != nil {
		return Cost{}, err
	}
	if p.space(); p.i < len(p.s) {
		return Cost{}, fmt.Errorf("%q: unexpected %q at %d", s, p.s[p.i:], p.i)
	}
	return c, nil
}

func (p *exprParser) space() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

// eat consumes c after white space and reports whether it was there.
func (p *exprParser) eat(c byte) bool {
	p.space()
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *exprParser) expr() (Cost, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > maxExprDepth {
		return Cost{}, fmt.Errorf("%q: nested deeper than %d", p.s, maxExprDepth)
	}
	first, err := p.term()
	if err != nil {
		return Cost{}, err
	}
	args := []Cost{first}
	for p.eat('+') {
		t, err := p.term()
		if err != nil {
			return Cost{}, err
		}
		args = append(args, t)
	}
	if len(args) == 1 {
		return first, nil
	}
	if len(args) > maxExprArgs {
		return Cost{}, fmt.Errorf("%q: a sum of more than %d terms", p.s, maxExprArgs)
	}
	return Cost{Kind: CostSum, Args: args}, nil
}

func (p *exprParser) term() (Cost, error) {
	a, err := p.atom()
	if err != nil || !p.eat('*') {
		return a, err
	}
	b, err := p.atom()
	if err != nil {
		return Cost{}, err
	}
	switch {
	case a.Kind == CostNumber && b.Kind == CostNumber:
		if a.N > MaxCost/b.N {
			return Cost{}, fmt.Errorf("%q: %d * %d is above %d", p.s, a.N, b.N, int64(MaxCost))
		}
		return Cost{Kind: CostNumber, N: a.N * b.N}, nil
	case a.Kind == CostNumber:
		return Cost{Kind: CostScaled, N: a.N, Args: []Cost{b}}, nil
	case b.Kind == CostNumber:
		return Cost{Kind: CostScaled, N: b.N, Args: []Cost{a}}, nil
	}
	return Cost{}, fmt.Errorf("%q: one side of * must be a whole number (a factor)", p.s)
}

func (p *exprParser) atom() (Cost, error) {
	p.space()
	if p.eat('(') {
		c, err := p.expr()
		if err != nil {
			return Cost{}, err
		}
		if !p.eat(')') {
			return Cost{}, fmt.Errorf("%q: missing ) at %d", p.s, p.i)
		}
		return c, nil
	}
	start := p.i
	for p.i < len(p.s) && !strings.ContainsRune(" \t,()+*", rune(p.s[p.i])) {
		p.i++
	}
	word := p.s[start:p.i]
	if p.i < len(p.s) && p.s[p.i] == '(' {
		p.i++
		switch word {
		case "max", "sum":
			return p.call(CostKind(word))
		case "prompt_tokens":
			return p.promptTokens()
		}
		return Cost{}, fmt.Errorf("%q: unknown function %q (want max, sum or prompt_tokens)", p.s, word)
	}
	if word == "" {
		return Cost{}, fmt.Errorf("%q: a cost expected at %d", p.s, start)
	}
	if n, err := strconv.ParseInt(word, 10, 64); err == nil {
		if n < 0 || n > MaxCost {
			return Cost{}, fmt.Errorf("%q: %d is not between 0 and %d", p.s, n, int64(MaxCost))
		}
		return Cost{Kind: CostNumber, N: n}, nil
	}
	return parseSource(word, p.response)
}

// call reads the operands of max or sum, up to the closing parenthesis.
func (p *exprParser) call(kind CostKind) (Cost, error) {
	var args []Cost
	for {
		a, err := p.expr()
		if err != nil {
			return Cost{}, err
		}
		args = append(args, a)
		if p.eat(')') {
			break
		}
		if !p.eat(',') {
			return Cost{}, fmt.Errorf("%q: want , or ) at %d", p.s, p.i)
		}
	}
	if len(args) > maxExprArgs {
		return Cost{}, fmt.Errorf("%q: %s of more than %d operands", p.s, kind, maxExprArgs)
	}
	return Cost{Kind: kind, Args: args}, nil
}

// promptTokens reads the arguments of prompt_tokens: json:POINTER [, bytes per token or an
// encoding].
func (p *exprParser) promptTokens() (Cost, error) {
	if p.response {
		return Cost{}, fmt.Errorf("%q: prompt_tokens estimates from a request; an answer reports its tokens (json:/usage/…)", p.s)
	}
	src, err := p.atom()
	if err != nil {
		return Cost{}, err
	}
	if src.Kind != CostJSON {
		return Cost{}, fmt.Errorf("%q: prompt_tokens takes json:<pointer> to the text (json:/messages)", p.s)
	}
	c := Cost{Kind: CostPromptTokens, Name: src.Name, N: DefaultBytesPerToken}
	if p.eat(',') {
		p.space()
		start := p.i
		for p.i < len(p.s) && p.s[p.i] != ')' && p.s[p.i] != ' ' {
			p.i++
		}
		arg := p.s[start:p.i]
		if slices.Contains(Encodings, arg) {
			c.Encoding = arg
		} else if n, err := strconv.ParseInt(arg, 10, 64); err == nil && n >= 1 && n <= 16 {
			c.N = n
		} else {
			return Cost{}, fmt.Errorf("%q: prompt_tokens' second argument is bytes per token (a whole number from 1 to 16) or a tokenizer (%s)",
				p.s, strings.Join(Encodings, ", "))
		}
	}
	if !p.eat(')') {
		return Cost{}, fmt.Errorf("%q: missing ) at %d", p.s, p.i)
	}
	return c, nil
}
