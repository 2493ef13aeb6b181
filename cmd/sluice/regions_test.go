package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// TestRegionsThroughTheCLI: `sluice regions` against a one-process ingress of region a, whose
// in-process workers renew the lease of a global queue on a real coordinator: a's row shows
// its lease, b's (which never renewed) its safe share, lost; and an ingress without regions
// says so.
func TestRegionsThroughTheCLI(t *testing.T) {
	coord := testenv.NATS(t)
	rec := workertest.NewRecorder(t)
	_, admin := ingress(t, fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
data_dir: DATA
region: a
regions: {names: [a, b], coordinator: %q, lease: 1s, renew: 250ms}
upstream: %[2]s
queues:
  - { name: llm, rate: 40/s, global: true, target: "POST %[2]s/llm" }
  - { name: local, rate: 5/s, target: "POST %[2]s/local" }
rules:
  - { name: per-key, key: [header:X-Key], algorithm: gcra, limit: 120, period: 1m, global: true }
`, coord.URL, rec.URL))
	var out string
	testenv.WaitFor(t, 10*time.Second, "a's leases of the queue and the rule in `sluice regions`", func() bool {
		var code int
		code, out, _ = sluice(admin, nil, "regions")
		return code == 0 && lineWith(out, "queue llm", " a ", "on its lease") && lineWith(out, "rule per-key", " a ", "on its lease")
	})
	t.Logf("\n%s", out)
	if !strings.Contains(out, "region a of a, b; coordinator ok") || !lineWith(out, "queue llm", " b ", "never renewed: safe share 20/s") ||
		!lineWith(out, "rule per-key", "2/s", " a ", "on its lease") ||
		strings.Contains(out, "local") {
		t.Errorf("sluice regions:\n%s", out)
	}
	if code, out, _ := sluice(admin, nil, "regions", "--json"); code != 0 || !strings.Contains(out, `"region": "a"`) {
		t.Errorf("sluice regions --json: %d %s", code, out)
	}
	_, plain := ingress(t, `listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
data_dir: DATA
queues:
  - { name: local, rate: 5/s, target: "POST http://127.0.0.1:9/" }
`)
	if code, out, _ := sluice(plain, nil, "regions"); code != 0 || !strings.HasPrefix(out, "no regions") {
		t.Errorf("without regions: %d %s", code, out)
	}
}

// lineWith reports whether a line of out holds every one of parts.
func lineWith(out string, parts ...string) bool {
	for line := range strings.Lines(out) {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			return true
		}
	}
	return false
}

// TestDashboardRegionsInBrowser: in real headless chromium, the dashboard's queues table shows
// a global queue's lease of its region beside its name ("a 40/s"), and nothing beside a queue
// that is not global; the rules table the same for a global rule (its limit per key, per second).
func TestDashboardRegionsInBrowser(t *testing.T) {
	ctx := browser(t)
	coord := testenv.NATS(t)
	rec := workertest.NewRecorder(t)
	_, admin := ingress(t, fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
data_dir: DATA
region: a
regions: {names: [a, b], coordinator: %q, lease: 1s, renew: 250ms}
upstream: %[2]s
queues:
  - { name: llm, rate: 40/s, global: true, target: "POST %[2]s/llm" }
  - { name: local, rate: 5/s, target: "POST %[2]s/local" }
rules:
  - { name: per-key, key: [header:X-Key], algorithm: gcra, limit: 120, period: 1m, global: true }
`, coord.URL, rec.URL))
	var badge, local, title, rule string
	err := chromedp.Run(ctx,
		chromedp.Navigate("http://"+admin+"/ui/"),
		chromedp.WaitVisible(`body[data-loaded="1"]`),
		// The first renewals pass the fresh coordinator's hold (one lease): then a's lease shows.
		chromedp.Poll(`document.querySelector('tr[data-queue="llm"] td.name .region')?.textContent === "a 40/s"`, nil,
			chromedp.WithPollingTimeout(15*time.Second)),
		chromedp.Text(`tr[data-queue="llm"] td.name .region`, &badge),
		chromedp.AttributeValue(`tr[data-queue="llm"] td.name .region`, "title", &title, nil),
		chromedp.Text(`tr[data-queue="local"] td.name`, &local),
		chromedp.Poll(`document.querySelector('tr[data-rule="per-key"] td.name .region')?.textContent === "a 2/s"`, nil,
			chromedp.WithPollingTimeout(10*time.Second)),
		chromedp.Text(`tr[data-rule="per-key"] td.name`, &rule),
	)
	if err != nil {
		t.Fatalf("the dashboard's region badge: %v", err)
	}
	if badge != "a 40/s" || local != "local" || !strings.Contains(title, "shared by a, b") || rule != "per-key a 2/s" {
		t.Errorf("badge %q (title %q), plain queue's name cell %q, global rule's %q", badge, title, local, rule)
	}
}
