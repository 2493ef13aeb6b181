package client_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencies holds the SDK to its promise: linking it pulls in the standard library,
// Sluice's retry package and its backoff library, and no server dependency.
func TestDependencies(t *testing.T) {
	goTool, err := exec.LookPath("go") // go test puts its own go first on PATH
	if err != nil {
		t.Fatalf("go tool not found: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps",
		"-f", "{{if not .Standard}}{{.ImportPath}}{{end}}",
		"github.com/sluice-rl/sluice/client").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	allowed := map[string]bool{
		"github.com/sluice-rl/sluice/client": true,
		"github.com/sluice-rl/sluice/retry":  true,
		"github.com/cenkalti/backoff/v4":     true,
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 {
		t.Fatal("go list printed no packages")
	}
	for _, dep := range deps {
		for _, banned := range []string{"labstack/echo", "nats-io", "redis/go-redis"} {
			if strings.Contains(dep, banned) {
				t.Errorf("client depends on %s, a server dependency", dep)
			}
		}
		if !allowed[dep] {
			t.Errorf("client depends on %s; only the standard library, retry and backoff are allowed", dep)
		}
	}
}
