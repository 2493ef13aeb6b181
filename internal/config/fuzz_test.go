package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParse checks that Parse never panics, and that it returns either a valid config or an
// *Error whose every line names the file.
func FuzzParse(f *testing.F) {
	full, err := os.ReadFile(filepath.Join("testdata", "full.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		string(full),
		"",
		"listen: ':1'\n",
		"rules: [{name: r, algorithm: gcra, limit: 1, period: 1s, key: [ip, 'header:X'], match: {path: /a/*}}]\nupstream: http://u\n",
		"queues: [{name: q, rate: 5/2s, target: 'PUT http://h/x', backoff: {initial: 1s, max: 1m}}]\n",
		"rules: {name: r}\n",
		"- a\n- b\n",
		"a: &x [1, *x]\n",
		"rules:\n  - name: a\n    algoritm: gcra\n  - x\n",
		"listen: [a\n",
		"redis: {url: 'redis://u:p@h:1/2'}\nnats: {url: 'a,b', replicas: 9}\n",
		"trusted_proxies: ['::1', 10.0.0.0/8, x]\n",
		"---\n---\n",
		"queues:\n  - name: q\n    rate: [1]\n    backoff: 5s\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("f.yaml", data, noEnv)
		if err == nil {
			if c == nil || c.Path != "f.yaml" {
				t.Fatalf("nil error but config %+v", c)
			}
			return
		}
		var ce *Error
		if !errors.As(err, &ce) || c != nil {
			t.Fatalf("error %T %v with config %v", err, err, c)
		}
		for _, line := range strings.Split(err.Error(), "\n") {
			if !strings.HasPrefix(line, "f.yaml:") {
				t.Fatalf("line %q does not name the file", line)
			}
		}
	})
}
