package queue

import (
	"regexp"
	"strings"
	"testing"
)

// tokenRE is what isToken checks, as the regexp it replaced.
var tokenRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// TestIsToken: isToken agrees with the regexp it replaced, on every byte and at the length
// bounds.
func TestIsToken(t *testing.T) {
	cases := []string{"", "a", "A-z_09", "01a205ae-fe9a-77bb-bee1-9e4c98ff7ca6", "a.b", "a b", "ä",
		"a\n", "*", ">", strings.Repeat("x", 128), strings.Repeat("x", 129)}
	for c := 0; c < 256; c++ {
		cases = append(cases, string([]byte{byte(c)}), "ab"+string([]byte{byte(c)})+"cd")
	}
	for _, s := range cases {
		if got, want := isToken(s, 128), tokenRE.MatchString(s); got != want {
			t.Errorf("isToken(%q, 128) = %v, the regexp says %v", s, got, want)
		}
	}
	if !isToken(strings.Repeat("x", 64), 64) || isToken(strings.Repeat("x", 65), 64) {
		t.Error("isToken(_, 64) does not bound the length at 64")
	}
}

// BenchmarkValidID: a job id checked by hand and by the regexp it replaced; every status
// write checks one.
func BenchmarkValidID(b *testing.B) {
	id := "01a205ae-fe9a-77bb-bee1-9e4c98ff7ca6"
	b.Run("isToken", func(b *testing.B) {
		for b.Loop() {
			if !validID(id) {
				b.Fatal("invalid")
			}
		}
	})
	b.Run("regexp", func(b *testing.B) {
		for b.Loop() {
			if !tokenRE.MatchString(id) {
				b.Fatal("invalid")
			}
		}
	})
}
