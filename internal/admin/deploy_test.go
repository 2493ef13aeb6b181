package admin

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

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
	for _, dir := range []string{".", "../ingress", "../worker"} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".go") && !strings.HasSuffix(e.Name(), "_test.go") {
				b, _ := os.ReadFile(dir + "/" + e.Name())
				code += string(b)
			}
		}
	}
	for _, m := range regexp.MustCompile(`sluice_[a-z_]+`).FindAllString(text, -1) {
		name := strings.TrimSuffix(m, "_bucket")
		if !strings.Contains(code, `"`+name+`"`) {
			t.Errorf("%s is used in deploy/ but exported by no process", m)
		}
	}
}
