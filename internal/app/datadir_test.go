//go:build !noembed

package app

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestDataDirLocked: a second embedded server on the same data_dir refuses to start, naming
// the directory and the pid that holds it; once the first stops, the directory is free again.
func TestDataDirLocked(t *testing.T) {
	dir := t.TempDir()
	first, err := startEmbeddedNATS(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = startEmbeddedNATS(dir)
	pid := strconv.Itoa(os.Getpid())
	if err == nil || !strings.Contains(err.Error(), "is in use by another Sluice process (pid "+pid+")") || !strings.Contains(err.Error(), dir) {
		t.Fatalf("second start on the same data_dir: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "jetstream")); err != nil {
		t.Fatalf("the first server's store: %v", err)
	}
	first.stop()
	again, err := startEmbeddedNATS(dir)
	if err != nil {
		t.Fatalf("start after the first stopped: %v", err)
	}
	again.stop()
}
