package arch

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/sluice-rl/sluice"

type pkg struct {
	Name       string
	ImportPath string
	Imports    []string
	Deps       []string
}

// packages lists every package of the module with its imports and dependencies.
func packages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", module+"/...")
	cmd.Dir = "../.."
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(out)
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages", len(pkgs))
	}
	return pkgs
}

func public(path string) bool {
	rel := strings.TrimPrefix(path, module+"/")
	return !strings.HasPrefix(rel, "internal/") && !strings.HasPrefix(rel, "cmd/") && !strings.Contains(rel, "/internal/")
}

// TestPublicPackagesImportNoInternal: nothing public imports internal/ — a public package's
// users could not follow it there.
func TestPublicPackagesImportNoInternal(t *testing.T) {
	for _, p := range packages(t) {
		if !public(p.ImportPath) || p.Name == "main" { // commands are not imported
			continue
		}
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, module+"/internal/") {
				t.Errorf("public package %s imports %s", p.ImportPath, imp)
			}
		}
	}
}

// TestAlgorithmsAndClientStayLight: the algorithm packages (limit, leaky, inflight) never import
// echo, NATS or OpenTelemetry, and the client SDK imports no server dependency at all.
func TestAlgorithmsAndClientStayLight(t *testing.T) {
	const otel = "go.opentelemetry.io/" // tracing lives in internal/tracing and the processes
	banned := map[string][]string{
		module + "/client":   {"github.com/labstack/echo", "github.com/nats-io/", "github.com/redis/go-redis", otel},
		module + "/limit":    {"github.com/labstack/echo", "github.com/nats-io/", otel},
		module + "/leaky":    {"github.com/labstack/echo", "github.com/nats-io/", otel},
		module + "/inflight": {"github.com/labstack/echo", "github.com/nats-io/", otel},
		module + "/retry":    {"github.com/labstack/echo", "github.com/nats-io/", "github.com/redis/go-redis", otel},
		module + "/jsonw":    {"github.com/"},
	}
	for _, p := range packages(t) {
		for _, dep := range p.Deps {
			for _, b := range banned[p.ImportPath] {
				if strings.HasPrefix(dep, b) {
					t.Errorf("%s depends on %s", p.ImportPath, dep)
				}
			}
		}
	}
}

// TestOpenAPIValidatorStaysInTests: kin-openapi, which validates the HTTP exchanges against the
// OpenAPI documents, is linked only into tests: no package but the test helper that wraps it
// (internal/openapi/openapitest) depends on it, so the binaries do not carry it.
func TestOpenAPIValidatorStaysInTests(t *testing.T) {
	helper := module + "/internal/openapi/openapitest"
	for _, p := range packages(t) {
		if p.ImportPath == helper {
			continue
		}
		for _, dep := range p.Deps {
			if strings.HasPrefix(dep, "github.com/getkin/") || dep == helper {
				t.Errorf("%s depends on %s", p.ImportPath, dep)
			}
		}
	}
}
