package retry

import "testing"

func TestIsToken(t *testing.T) {
	for s, want := range map[string]bool{
		"GET": true, "X-API-Key": true, "M-SEARCH": true, "a!#$%&'*+-.^_`|~z": true,
		"": false, "X Key": false, "X:Key": false, "a/b": false, "é": false, "a\x00": false,
	} {
		if got := IsToken(s); got != want {
			t.Errorf("IsToken(%q) = %v, want %v", s, got, want)
		}
	}
	if !isTokenChar(':') || !isTokenChar('/') || IsTokenChar(':') {
		t.Error("a Structured Fields token takes ':' and '/', an HTTP token does not")
	}
}
