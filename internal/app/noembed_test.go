package app

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoEmbedBuild builds the ingress as the production image does (-tags noembed): the
// nats-server module is left out, and a config without a nats section exits with status 2 and
// a message that says why and what to set.
func TestNoEmbedBuild(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "ingress")
	build := exec.Command("go", "build", "-tags", "noembed", "-o", bin, "../../cmd/ingress")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -tags noembed: %v\n%s", err, out)
	}
	deps, err := exec.Command("go", "list", "-tags", "noembed", "-deps", "../../cmd/ingress").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(deps), "nats-server") {
		t.Fatal("the noembed ingress still links the nats-server module")
	}
	cfg := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfg, []byte("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nqueues: [{name: q, rate: 1/s}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-config", cfg).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("exit %v, want status 2\n%s", err, out)
	}
	for _, want := range []string{"sluice.yaml", "no embedded NATS server", "nats.url"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output does not say %q:\n%s", want, out)
		}
	}
}
