package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// browser returns a headless chromium with a window the dashboard fits in.
func browser(t *testing.T) context.Context {
	t.Helper()
	return testenv.Browser(t, 90*time.Second, chromedp.WindowSize(1000, 900))
}

// TestDashboardInBrowser loads /ui/ of a real ingress in headless chromium: the page lists the
// queues and rules read from the admin API with when each backlog empties, shows the
// in-process workers in the health panel, draws a chart per queue, and its pause button pauses
// the queue for every worker. SLUICE_SCREENSHOT=path also lets a 2/s queue drain until the
// history has half a minute of it and saves a screenshot of the page (docs/dashboard.png is
// made so).
func TestDashboardInBrowser(t *testing.T) {
	ctx := browser(t)
	rec := workertest.NewRecorder(t)
	listen, admin := ingress(t, fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
data_dir: DATA
upstream: %[1]s
queues:
  - { name: orders, rate: 20/s, target: "POST %[1]s/orders" }
  - { name: reports, rate: 2/s, target: "POST %[1]s/reports" }
  - { name: shared, rate: 2/s, tenant: "header:X-Tenant", fair: true, target: "POST %[1]s/shared" }
rules:
  - { name: api-per-key, match: { path: /api/* }, key: [header:X-API-Key], algorithm: token_bucket, limit: 5, period: 1s }
`, rec.URL))
	for i := range 20 {
		submit(t, listen, "orders", fmt.Sprint("order ", i))
	}
	for i := range 60 { // 30 s of work at 2/s
		submit(t, listen, "reports", fmt.Sprint("report ", i))
	}

	var queues, rules, tenants, notFair, empties, emptyShared, health string
	err := chromedp.Run(ctx,
		chromedp.Navigate("http://"+admin+"/ui/"),
		chromedp.WaitVisible(`body[data-loaded="1"]`),
		chromedp.WaitVisible(`#chart-orders`),
		chromedp.Text(`tr[data-queue="reports"] td.empties`, &empties),
		chromedp.Text(`tr[data-queue="shared"] td.empties`, &emptyShared),
		chromedp.WaitVisible(`#workers`),
		chromedp.Text(`#health`, &health),
		chromedp.Text(`#queues tbody`, &queues),
		chromedp.Text(`#rules tbody`, &rules),
		chromedp.Text(`tr[data-queue="shared"] td.tenants`, &tenants),
		chromedp.Text(`tr[data-queue="orders"] td.tenants`, &notFair),
	)
	if err != nil {
		t.Fatalf("loading the dashboard: %v", err)
	}
	for _, want := range []string{"orders", "reports", "20/s"} {
		if !strings.Contains(queues, want) {
			t.Errorf("the queues table does not show %q:\n%s", want, queues)
		}
	}
	if tenants != "0" || notFair != "-" {
		t.Errorf("tenants column: fair queue %q, plain queue %q; want 0 and -", tenants, notFair)
	}
	// About 60 jobs at 2/s: half a minute, less what went while the page loaded.
	if !regexp.MustCompile(`^[1-3]\d s$`).MatchString(empties) || emptyShared != "empty" {
		t.Errorf("empties in: %q for 60 jobs at 2/s, %q for an empty queue", empties, emptyShared)
	}
	if strings.Contains(health, "no worker process announced itself") || !strings.Contains(health, "orders, reports, shared") {
		t.Errorf("the health panel does not list the in-process workers and their queues:\n%s", health)
	}
	// At 1 000 px the queues table fits: its controls stay beside their fields, no scrolling.
	var tableWidth, viewWidth float64
	if err := chromedp.Run(ctx,
		chromedp.Evaluate(`document.getElementById("queues").getBoundingClientRect().right`, &tableWidth),
		chromedp.Evaluate(`document.documentElement.clientWidth`, &viewWidth),
	); err != nil {
		t.Fatal(err)
	}
	if tableWidth > viewWidth {
		t.Errorf("the queues table is %.0f px wide in a %.0f px window", tableWidth, viewWidth)
	}
	if !strings.Contains(rules, "api-per-key") {
		t.Errorf("the rules table does not show the rule:\n%s", rules)
	}

	// The pause button pauses the queue, as the API reports it.
	if err := chromedp.Run(ctx, chromedp.Click(`tr[data-queue="orders"] button.toggle`)); err != nil {
		t.Fatalf("clicking pause: %v", err)
	}
	testenv.WaitFor(t, 10*time.Second, "the queue paused through the page", func() bool {
		_, out, _ := sluice(admin, nil, "--json", "queue", "orders")
		var q struct{ Paused bool }
		return json.Unmarshal([]byte(out), &q) == nil && q.Paused
	})
	var paused string
	if err := chromedp.Run(ctx,
		chromedp.WaitVisible(`tr[data-queue="orders"] td.paused`),
		chromedp.Text(`tr[data-queue="orders"] button.toggle`, &paused),
	); err != nil {
		t.Fatalf("the page does not show the pause: %v", err)
	}
	if paused != "resume" {
		t.Errorf("the button of a paused queue says %q, want resume", paused)
	}

	if path := os.Getenv("SLUICE_SCREENSHOT"); path != "" {
		if code, _, errOut := sluice(admin, nil, "resume", "orders"); code != 0 {
			t.Fatal(errOut)
		}
		for i := range 60 { // the drain still runs when the picture is taken
			submit(t, listen, "reports", fmt.Sprint("more ", i))
		}
		var png []byte
		if err := chromedp.Run(ctx,
			// 30 s of samples: the drain beside its allowed rate.
			chromedp.Poll(`Number(document.getElementById("chart-reports").dataset.points) >= 7`, nil, chromedp.WithPollingTimeout(time.Minute)),
			chromedp.FullScreenshot(&png, 100)); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
