package admin

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-rl/sluice/internal/config"
)

// TestComposeShipsNoToken: deploy/compose.yaml gives its processes no admin token unless
// the operator exports one (a shipped token is everyone's token), and deploy/sluice.yaml
// loads with what it gives them.
func TestComposeShipsNoToken(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Sluice struct {
			Environment map[string]string `yaml:"environment"`
		} `yaml:"x-sluice"`
	}
	if err := yaml.Unmarshal(raw, &compose); err != nil {
		t.Fatal(err)
	}
	v, ok := compose.Sluice.Environment[config.EnvAdminToken]
	if !ok {
		t.Fatalf("x-sluice sets no %s: %v", config.EnvAdminToken, compose.Sluice.Environment)
	}
	// ${SLUICE_ADMIN_TOKEN:-default} is default when the operator exported nothing.
	if m := regexp.MustCompile(`^\$\{SLUICE_ADMIN_TOKEN(:?-(.*))?\}$`).FindStringSubmatch(v); m != nil {
		v = m[2]
	}
	file, err := os.ReadFile("../../deploy/sluice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("deploy/sluice.yaml", file, func(k string) string {
		return map[string]string{config.EnvAdminToken: v}[k]
	})
	if err != nil {
		t.Fatalf("deploy/sluice.yaml with compose's environment: %v", err)
	}
	if cfg.AdminToken != "" {
		t.Errorf("compose ships the admin token %q", cfg.AdminToken)
	}
}

// TestDeployFiles: the example alert rules and Grafana dashboard parse, and every sluice_
// metric they use is one the processes export (its name appears in the code).
func TestDeployFiles(t *testing.T) {
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert, Expr string
			}
		}
	}
	raw, err := os.ReadFile("../../deploy/prometheus-alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil || len(rules.Groups) == 0 || len(rules.Groups[0].Rules) == 0 {
		t.Fatalf("alert rules: %v", err)
	}
	text := string(raw)
	dash, err := os.ReadFile("../../deploy/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	if err := json.Unmarshal(dash, &d); err != nil || d["panels"] == nil {
		t.Fatalf("dashboard: %v", err)
	}
	text += string(dash)
	code := ""
	for _, dir := range []string{".", "../ingress", "../worker", "../app"} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".go") && !strings.HasSuffix(e.Name(), "_test.go") {
				b, _ := os.ReadFile(dir + "/" + e.Name())
				code += string(b)
			}
		}
	}
	// The metrics of the operating views are on the dashboard and in the alerts.
	for _, m := range []string{"sluice_queue_desired_workers", "sluice_queue_consumers", "sluice_queue_effective_rate"} {
		if !strings.Contains(string(dash), m) || !strings.Contains(string(raw), m) && m != "sluice_queue_effective_rate" {
			t.Errorf("%s is missing from the Grafana dashboard or the alert rules", m)
		}
	}
	for _, m := range regexp.MustCompile(`sluice_[a-z_]+`).FindAllString(text, -1) {
		name := strings.TrimSuffix(m, "_bucket")
		if !strings.Contains(code, `"`+name+`"`) {
			t.Errorf("%s is used in deploy/ but exported by no process", m)
		}
	}
}
