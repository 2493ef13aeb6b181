package cost

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/internal/config"
)

func TestPointer(t *testing.T) {
	doc := `{"model":"m","messages":[{"role":"user","content":"a \"quoted\" } ] text"}],` +
		`"max_tokens": 1500 ,"usage":{"total_tokens":812,"nested":{"x":[1,2.5,{"y":3e2}]}},` +
		`"a/b":7,"m~n":8,"esc\u0061ped":9,"neg":-4,"big":1e300,"frac":12.25,"s":"12","t":true,"n":null}`
	for _, c := range []struct {
		ptr  string
		want int64
		ok   bool
	}{
		{"/max_tokens", 1500, true},
		{"/usage/total_tokens", 812, true},
		{"/usage/nested/x/0", 1, true},
		{"/usage/nested/x/1", 3, true}, // a fraction is rounded up
		{"/usage/nested/x/2/y", 300, true},
		{"/a~1b", 7, true},
		{"/m~0n", 8, true},
		{"/escaped", 9, true},
		{"/frac", 13, true},
		{"/neg", 0, false},
		{"/big", 0, false},
		{"/s", 12, true}, // a number in a string is that number (as pydantic reads it)
		{"/t", 0, false},
		{"/n", 0, false},
		{"/missing", 0, false},
		{"/usage/nested/x/3", 0, false},
		{"/usage/nested/x/01", 0, false},
		{"/usage/nested/x/-1", 0, false},
		{"/usage/nested/x/+1", 0, false},
		{"/messages/0/content", 0, false},
		{"", 0, false}, // the whole document is no number
	} {
		got, ok := Pointer([]byte(doc), c.ptr)
		if got != c.want || ok != c.ok {
			t.Errorf("Pointer(%q) = %d, %v; want %d, %v", c.ptr, got, ok, c.want, c.ok)
		}
	}
	for _, bad := range []string{
		``, `not json`, `{"max_tokens":}`, `{"max_tokens" 5}`, `{"max_tokens":05}`, `{"max_tokens":5.}`,
		`{"x":"unterminated,"max_tokens":5}`, `{"x":[1,2,"max_tokens":5}`, `[{"max_tokens":5}]`,
		// A name on the path twice where one of them holds no number.
		`{"max_tokens":1,"MAX_TOKENS":"x"}`, `{"max_tokens":1,"max_tokens":null}`,
		strings.Repeat("[", 2000) + strings.Repeat("]", 2000),
	} {
		if n, ok := Pointer([]byte(bad), "/max_tokens"); ok {
			t.Errorf("Pointer(%q) = %d, ok", bad, n)
		}
	}
	// Deep nesting beside the path is skipped up to maxDepth, and refused beyond.
	deep := `{"a":` + strings.Repeat("[", 900) + strings.Repeat("]", 900) + `,"max_tokens":5}`
	if n, ok := Pointer([]byte(deep), "/max_tokens"); n != 5 || !ok {
		t.Errorf("beside 900 levels: %d, %v", n, ok)
	}
	deeper := `{"a":` + strings.Repeat("[", 1100) + strings.Repeat("]", 1100) + `,"max_tokens":5}`
	if _, ok := Pointer([]byte(deeper), "/max_tokens"); ok {
		t.Error("beside 1100 levels: read")
	}
}

func TestFromRequest(t *testing.T) {
	h := http.Header{"X-Cost": {"42"}, "X-Bad": {"lots"}, "X-Neg": {"-1"}, "X-Zero": {"0"}, "X-Huge": {"9999999999999999"}}
	body := []byte(`{"max_tokens":2000}`)
	for _, c := range []struct {
		cost  string
		query string
		want  int64
		ok    bool
	}{
		{"header:x-cost", "", 42, true},
		{"header:x-bad", "", 0, false},
		{"header:x-neg", "", 0, false},
		{"header:x-zero", "", 1, true}, // a request costs at least 1
		{"header:x-huge", "", 0, false},
		{"header:x-missing", "", 0, false},
		{"query:units", "a=1&units=17", 17, true},
		{"query:units", "units=2.5", 3, true},
		{"query:units", "unit%73=9", 9, true},
		{"query:units", "a=1", 0, false},
		{"query:units", "units=%zz", 0, false},
		{"json:/max_tokens", "", 2000, true},
		{"json:/missing", "", 0, false},
		{"body_bytes", "", int64(len(body)), true},
		{"7", "", 7, true},
	} {
		spec, err := config.ParseCost(c.cost, false)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := FromRequest(spec, h, c.query, body)
		if got != c.want || ok != c.ok {
			t.Errorf("FromRequest(%s, %q) = %d, %v; want %d, %v", c.cost, c.query, got, ok, c.want, c.ok)
		}
	}
	if n, ok := FromRequest(config.Cost{}, nil, "", nil); n != 1 || !ok {
		t.Errorf("the zero Cost costs %d, %v; want 1", n, ok)
	}
	if n, ok := FromRequest(config.Cost{Kind: config.CostBodyBytes}, nil, "", nil); n != 1 || !ok {
		t.Errorf("an empty body costs %d, %v; want 1", n, ok)
	}
}

func TestFromResponse(t *testing.T) {
	body := []byte(`{"usage":{"total_tokens":0}}`)
	h := http.Header{"X-Used": {"350"}}
	for _, c := range []struct {
		cost string
		want int64
		ok   bool
	}{
		{"json:/usage/total_tokens", 0, true}, // a true cost may be 0: all of it refunded
		{"header:x-used", 350, true},
		{"header:x-other", 0, false},
	} {
		spec, err := config.ParseCost(c.cost, true)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := FromResponse(spec, h, body); got != c.want || ok != c.ok {
			t.Errorf("FromResponse(%s) = %d, %v; want %d, %v", c.cost, got, ok, c.want, c.ok)
		}
	}
	if _, ok := FromResponse(config.Cost{}, h, body); ok {
		t.Error("the zero Cost read from an answer")
	}
}

// Pointer agrees with a reference built on encoding/json's decoding of the whole document:
// the largest of the numbers (or numeric strings) at the pointer, where every member whose
// name encoding/json would match to a token (case folded, bytes.EqualFold, Kelvin sign and
// long s included; repeated names all kept) counts. Where the document is valid JSON, both
// find the same or nothing; Pointer does not read past the value it needs, so on an invalid
// document it may find what the reference refuses.
func FuzzPointer(f *testing.F) {
	f.Add(`{"usage":{"total_tokens":812}}`, "/usage/total_tokens")
	f.Add(`{"a":[1,{"b":2.5}]}`, "/a/1/b")
	f.Add(`{"a\u002fb":3}`, "/a~1b")
	f.Add(`{"x":"\\\"","y":[true,false,null],"z":-0.5e-3}`, "/z")
	f.Add(`{"max_tokens":1,"MAX_TOKENS":900}`, "/max_tokens")
	f.Add("{\"max_tokens\":1,\"max_to\u212aens\":900,\"max_token\u017f\":\"77\"}", "/max_tokens")
	f.Add(`{"u":{"t":5},"U":{"T":"70"},"u":{"t":1}}`, "/u/t")
	f.Fuzz(func(t *testing.T, doc, ptr string) {
		got, ok := Pointer([]byte(doc), ptr)
		want, wok := reference(doc, ptr)
		valid := json.Valid([]byte(doc))
		switch {
		case ok && wok && got != want:
			t.Fatalf("Pointer(%q, %q) = %d, encoding/json %d", doc, ptr, got, want)
		case wok && !ok:
			t.Fatalf("Pointer(%q, %q) found nothing; encoding/json %d", doc, ptr, want)
		case ok && !wok && valid:
			t.Fatalf("Pointer(%q, %q) = %d; encoding/json finds nothing in a valid document", doc, ptr, got)
		}
	})
}

// member is one member of an object as decoded by orderedDecode: every one, in order.
type member struct {
	name string
	v    any
}

// orderedDecode decodes the next value of d with encoding/json's tokenizer, keeping an
// object's members all and in order ([]member), numbers as json.Number.
func orderedDecode(d *json.Decoder) (any, error) {
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch x := tok.(type) {
	case json.Delim:
		switch x {
		case '{':
			var obj []member
			for d.More() {
				nt, err := d.Token()
				if err != nil {
					return nil, err
				}
				v, err := orderedDecode(d)
				if err != nil {
					return nil, err
				}
				obj = append(obj, member{nt.(string), v})
			}
			_, err := d.Token()
			return obj, err
		case '[':
			arr := []any{}
			for d.More() {
				v, err := orderedDecode(d)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			_, err := d.Token()
			return arr, err
		}
	}
	return tok, nil
}

// reference is Pointer by encoding/json.
func reference(doc, ptr string) (int64, bool) {
	d := json.NewDecoder(strings.NewReader(doc))
	d.UseNumber()
	v, err := orderedDecode(d)
	if err != nil {
		return 0, false
	}
	if _, err := d.Token(); err != io.EOF {
		return 0, false
	}
	if ptr == "" {
		return refValue(v, nil) // the whole document (RFC 6901)
	}
	if ptr[0] != '/' {
		return 0, false
	}
	var toks []string
	for _, tok := range strings.Split(ptr[1:], "/") {
		toks = append(toks, strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~"))
	}
	return refValue(v, toks)
}

func refValue(v any, toks []string) (int64, bool) {
	if len(toks) == 0 {
		switch x := v.(type) {
		case json.Number:
			return number(string(x))
		case string:
			return number(x)
		}
		return 0, false
	}
	tok := toks[0]
	switch x := v.(type) {
	case []member:
		var most int64
		found := false
		for _, m := range x {
			if !bytes.EqualFold([]byte(m.name), []byte(tok)) {
				continue
			}
			n, ok := refValue(m.v, toks[1:])
			if !ok {
				return 0, false
			}
			most, found = max(most, n), true
		}
		return most, found
	case []any:
		i, err := strconv.Atoi(tok)
		if err != nil || i < 0 || i >= len(x) || (len(tok) > 1 && tok[0] == '0') || tok[0] == '+' || tok[0] == '-' {
			return 0, false
		}
		return refValue(x[i], toks[1:])
	}
	return 0, false
}

// A chat-completion request of about 4 KiB with max_tokens after the messages, as clients
// send it.
func BenchmarkPointer(b *testing.B) {
	doc := []byte(`{"model":"gpt","messages":[` + strings.Repeat(`{"role":"user","content":"`+strings.Repeat("lorem ipsum ", 30)+`"},`, 10) +
		`{"role":"user","content":"end"}],"temperature":0.2,"max_tokens":1500}`)
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	for b.Loop() {
		if n, ok := Pointer(doc, "/max_tokens"); n != 1500 || !ok {
			b.Fatal(n, ok)
		}
	}
}

func BenchmarkFromRequestHeader(b *testing.B) {
	h := http.Header{"X-Cost": {"42"}}
	c := config.Cost{Kind: config.CostHeader, Name: "X-Cost"}
	b.ReportAllocs()
	for b.Loop() {
		if n, ok := FromRequest(c, h, "", nil); n != 42 || !ok {
			b.Fatal(n, ok)
		}
	}
}

// Ambiguous costs are charged their largest candidate, and numbers in strings are read as the
// upstream reads them: never less than what it counts.
func TestAmbiguousCostsChargeTheLargest(t *testing.T) {
	hdr := http.Header{"X-Cost": {"1", "60"}}
	for _, c := range []struct {
		name  string
		spec  string
		h     http.Header
		query string
		body  string
		want  int64
		ok    bool
	}{
		{name: "repeated query value", spec: "query:limit", query: "limit=1&limit=60", want: 60, ok: true},
		{name: "repeated query value, escaped name", spec: "query:limit", query: "limit=60&l%69mit=1", want: 60, ok: true},
		{name: "repeated query value, one malformed", spec: "query:limit", query: "limit=1&limit=x", ok: false},
		{name: "repeated header value", spec: "header:X-Cost", h: hdr, want: 60, ok: true},
		{name: "numeric string at the pointer", spec: "json:/max_tokens", body: `{"max_tokens":"16000"}`, want: 16000, ok: true},
		{name: "numeric string with a fraction", spec: "json:/max_tokens", body: `{"max_tokens":"1.5"}`, want: 2, ok: true},
		{name: "string that is no number", spec: "json:/max_tokens", body: `{"max_tokens":"many"}`, ok: false},
		{name: "a name twice", spec: "json:/max_tokens", body: `{"max_tokens":1,"max_tokens":5000}`, want: 5000, ok: true},
		{name: "a name twice, one escaped", spec: "json:/max_tokens", body: `{"max_tokens":5000,"max_tok\u0065ns":1}`, want: 5000, ok: true},
		{name: "names that differ in case", spec: "json:/max_tokens", body: `{"max_tokens":1,"MAX_TOKENS":900}`, want: 900, ok: true},
		{name: "Kelvin sign for k", spec: "json:/max_tokens", body: "{\"max_tokens\":1,\"max_to\u212aens\":900}", want: 900, ok: true},
		{name: "Kelvin sign escaped", spec: "json:/max_tokens", body: `{"max_tokens":1,"max_to\u212aens":900}`, want: 900, ok: true},
		{name: "long s for s", spec: "json:/max_tokens", body: "{\"max_token\u017f\":900,\"max_tokens\":1}", want: 900, ok: true},
		{name: "case on an inner name", spec: "json:/usage/total_tokens", body: `{"usage":{"total_tokens":5},"Usage":{"Total_Tokens":70}}`, want: 70, ok: true},
		{name: "a numeric string beside a number", spec: "json:/max_tokens", body: `{"max_tokens":1,"Max_Tokens":"16000"}`, want: 16000, ok: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec, err := config.ParseCost(c.spec, false)
			if err != nil {
				t.Fatal(err)
			}
			n, ok := FromRequest(spec, c.h, c.query, []byte(c.body))
			if ok != c.ok || ok && n != c.want {
				t.Errorf("got %d %v, want %d %v", n, ok, c.want, c.ok)
			}
		})
	}
}

// Expressions charge a bound on the truth: a prompt estimate plus the completion bound.
func TestExpressions(t *testing.T) {
	chat := func(prompt, rest string) string {
		return `{"model":"m","messages":[{"role":"user","content":"` + prompt + `"}]` + rest + `}`
	}
	const llm = "max(json:/max_completion_tokens, json:/max_tokens, 4096) + prompt_tokens(json:/messages)"
	msgs := len(`[{"role":"user","content":""}]`)
	for _, c := range []struct {
		name, spec, body, query string
		h                       http.Header
		want                    int64
		ok                      bool
	}{
		{name: "no bound given: the default", spec: llm, body: chat("hi", ""), want: 4096 + int64(msgs+2+1)/2, ok: true},
		{name: "max_tokens below the default", spec: llm, body: chat("hi", `,"max_tokens":1`), want: 4096 + int64(msgs+2+1)/2, ok: true},
		{name: "max_completion_tokens above it", spec: llm, body: chat("hi", `,"max_tokens":1,"max_completion_tokens":9000`), want: 9000 + int64(msgs+2+1)/2, ok: true},
		{name: "a 64 000-character prompt", spec: llm, body: chat(strings.Repeat("a", 64000), `,"max_tokens":1`), want: 4096 + int64(msgs+64000+1)/2, ok: true},
		{name: "a numeric string, cased", spec: llm, body: chat("", `,"MAX_TOKENS":"16000"`), want: 16000 + int64(msgs)/2, ok: true},
		{name: "no messages: no prompt", spec: llm, body: `{"max_tokens":5000}`, want: 5000, ok: true},
		{name: "not JSON", spec: llm, body: `{"max_tokens":5000,`, ok: false},
		{name: "one byte a token", spec: "prompt_tokens(json:/p, 1)", body: `{"p":"abcd"}`, want: 6, ok: true},
		{name: "sum needs every term", spec: "sum(json:/a, header:X-B)", body: `{"a":3}`, ok: false},
		{name: "sum of two", spec: "json:/a + header:X-B", body: `{"a":3}`, h: http.Header{"X-B": {"4"}}, want: 7, ok: true},
		{name: "a factor", spec: "3 * query:n", query: "n=5", want: 15, ok: true},
		{name: "a factor after", spec: "(json:/a + 1) * 2", body: `{"a":3}`, want: 8, ok: true},
		{name: "max of nothing readable", spec: "max(json:/a, json:/b)", body: `{}`, ok: false},
		// o200k: role, user, content and hello are one token each, each plus one, plus 3.
		{name: "a real tokenizer", spec: "prompt_tokens(json:/messages, o200k)", body: chat("hello", ""), want: 11, ok: true},
		{name: "a real tokenizer, no text", spec: "prompt_tokens(json:/messages, cl100k)", body: `{"max_tokens":5}`, want: 1, ok: true},
		{name: "a real tokenizer, not JSON", spec: "prompt_tokens(json:/messages, o200k)", body: `{"messages":[`, ok: false},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec, err := config.ParseCost(c.spec, false)
			if err != nil {
				t.Fatal(err)
			}
			n, ok := FromRequest(spec, c.h, c.query, []byte(c.body))
			if ok != c.ok || ok && n != c.want {
				t.Errorf("%s: got %d %v, want %d %v", spec, n, ok, c.want, c.ok)
			}
		})
	}
	// An answer's true cost may be a sum too (Anthropic reports input and output apart).
	spec, err := config.ParseCost("json:/usage/input_tokens + json:/usage/output_tokens", true)
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := FromResponse(spec, nil, []byte(`{"usage":{"input_tokens":120,"output_tokens":30}}`)); n != 150 || !ok {
		t.Errorf("a sum from an answer: %d %v, want 150", n, ok)
	}
	// The tokenizer counts at least what the text holds: 64 000 bytes built to tokenize badly
	// are more tokens than the 2-bytes bound says, and the tokenizer says so.
	contrived := chat(strings.Repeat("!@#$%^&*()", 6400), "")
	spec, err = config.ParseCost("prompt_tokens(json:/messages, o200k)", false)
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := FromRequest(spec, nil, "", []byte(contrived)); !ok || n <= 32000 {
		t.Errorf("o200k counts %d tokens in 64 000 bytes of punctuation, want more than the bytes bound's 32 000", n)
	}
	for _, bad := range []string{"prompt_tokens(json:/messages)", "query:n + json:/a", "max(json:/a"} {
		if _, err := config.ParseCost(bad, true); err == nil {
			t.Errorf("cost_from_response %q accepted", bad)
		}
	}
}
