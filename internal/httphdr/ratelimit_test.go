package httphdr

import (
	"testing"
	"time"
)

func TestSFString(t *testing.T) {
	for in, want := range map[string]string{
		"orders":       `"orders"`,
		`a"b\c`:        `"a\"b\\c"`,
		"tab\there":    `"tab?here"`,
		"naïve":        `"na??ve"`,
		"":             `""`,
		"rls:api.key_": `"rls:api.key_"`,
	} {
		if got := SFString(in); got != want {
			t.Errorf("SFString(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestCeilSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		-time.Second: 0, 0: 0, time.Nanosecond: 1, time.Second: 1, time.Second + 1: 2, 90 * time.Second: 90,
	} {
		if got := CeilSeconds(d); got != want {
			t.Errorf("CeilSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}
