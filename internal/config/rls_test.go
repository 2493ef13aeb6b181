package config

import (
	"strings"
	"testing"
)

// TestRLSKeys: rls_listen and rls come together, the directory is required, and bad values
// are named.
func TestRLSKeys(t *testing.T) {
	cfg, err := Parse("s.yaml", []byte("rls_listen: 127.0.0.1:8081\nrls: {config_dir: /etc/ratelimit, reflection: true}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RLSListen != "127.0.0.1:8081" || cfg.RLS == nil || cfg.RLS.ConfigDir != "/etc/ratelimit" || !cfg.RLS.Reflection {
		t.Fatalf("parsed %q %+v", cfg.RLSListen, cfg.RLS)
	}
	if cfg, err := Parse("s.yaml", []byte("listen: 127.0.0.1:8080\n"), nil); err != nil || cfg.RLS != nil || cfg.RLSListen != "" {
		t.Fatalf("without rls: %v %+v", err, cfg)
	}
	for text, want := range map[string]string{
		"rls_listen: 127.0.0.1:8081\n":                                      "s.yaml: rls: required with rls_listen",
		"rls: {config_dir: d}\n":                                            "s.yaml: rls_listen: required with an rls section",
		"rls_listen: 127.0.0.1:8081\nrls: {reflection: true}\n":             "s.yaml: rls.config_dir: required",
		"rls_listen: nowhere\nrls: {config_dir: d}\n":                       `s.yaml: rls_listen: invalid address "nowhere"`,
		"rls_listen: 127.0.0.1:1\nrls: {config_dir: d, reflection: sure}\n": `rls.reflection: want true or false, got "sure"`,
		"rls_listen: 127.0.0.1:1\nrls: {config_dir: d, domains: x}\n":       `unknown field "domains"`,
	} {
		_, err := Parse("s.yaml", []byte(text), nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", text, err, want)
		}
	}
}
