package jsonw

import (
	"encoding/json"
	"testing"
)

// tricky holds strings that need escaping as JSON.
var tricky = []string{
	"", "orders-per-key", `say "hi"`, `back\slash`, "tab\tnew\nline\rcr\bbs\fff",
	"\x00\x01\x1f\x7f", "<script>&amp;</script>", "line\u2028para\u2029end", "héllo wörld ✓ 日本 🚀",
	"bad \x80 byte", "truncated \xe2\x82", "surrogate \xed\xa0\x80", "overlong \xc0\xaf", "\ufffd",
	"ends with \xf0",
}

// FuzzAppendString checks AppendString against encoding/json on any string.
func FuzzAppendString(f *testing.F) {
	for _, s := range tricky {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendString([]byte("x"), s); string(got[1:]) != string(want) {
			t.Fatalf("AppendString(%q) = %s, want %s", s, got[1:], want)
		}
	})
}
