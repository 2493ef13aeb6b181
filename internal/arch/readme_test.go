package arch

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// repoPathRE is a path into this repository as the README writes one, in prose or in a
// command: a file or directory under one of the top-level directories (cmd/ingress,
// ./examples/upstream, deploy/kubernetes/, .ci/run).
var repoPathRE = regexp.MustCompile(`(?:^|[\s(\x60'"])(?:\./)?((?:\.ci|cmd|deploy|docs|examples|internal|scripts|client|queue|leaky|limit|inflight|retry)/[A-Za-z0-9_./-]*[A-Za-z0-9_/])`)

// TestReadmePaths: every file and directory of this repository that README.md names — a
// config it runs, a package it builds or runs, a test it cites — exists, so that its commands
// and pointers do not go stale when a file moves (TestDocLinks covers its Markdown links).
func TestReadmePaths(t *testing.T) {
	root := "../.."
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, m := range repoPathRE.FindAllStringSubmatch(string(b), -1) {
		p := m[1]
		if seen[p] {
			continue
		}
		seen[p] = true
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("README.md names %s: %v", p, err)
		}
	}
	if len(seen) < 5 {
		t.Errorf("only %d repository paths found in README.md; the pattern is out of date: %v", len(seen), seen)
	}
	t.Logf("%d paths checked", len(seen))
}
