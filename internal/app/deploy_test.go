package app

import (
	"os"
	"regexp"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-rl/sluice/internal/config"
)

// deploy/compose.yaml builds its one image once, gives every Sluice process more time to stop
// than its shutdown_timeout, and the image ships the CLI. (Before: four services built the
// same image, the grace equalled the timeout, and `sluice` was not in the image.)
func TestComposeAndImage(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Build           any    `yaml:"build"`
			Image           string `yaml:"image"`
			StopGracePeriod string `yaml:"stop_grace_period"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &compose); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load("../../deploy/sluice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	builds := 0
	for name, s := range compose.Services {
		if s.Image != "sluice:local" {
			continue
		}
		if s.Build != nil {
			builds++
		}
		grace, err := time.ParseDuration(s.StopGracePeriod)
		if err != nil || grace <= cfg.ShutdownTimeout {
			t.Errorf("service %s: stop_grace_period %q; want longer than shutdown_timeout %v", name, s.StopGracePeriod, cfg.ShutdownTimeout)
		}
	}
	if builds != 1 {
		t.Errorf("%d services build sluice:local; want 1", builds)
	}
	df, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`go build [^\n]*-o /out/sluice \./cmd/sluice`).Match(df) {
		t.Error("the Dockerfile does not build the sluice CLI into the image")
	}
}
