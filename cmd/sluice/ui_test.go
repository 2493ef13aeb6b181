package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
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
	return testenv.Browser(t, 90*time.Second, chromedp.WindowSize(1200, 900))
}

// TestDashboardInBrowser loads /ui/ of a real ingress in headless chromium: the page lists the
// queues and rules read from the admin API, draws a chart per queue, and its pause button
// pauses the queue for every worker. SLUICE_SCREENSHOT=path saves a screenshot of the page.
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

	var queues, rules, tenants, notFair string
	err := chromedp.Run(ctx,
		chromedp.Navigate("http://"+admin+"/ui/"),
		chromedp.WaitVisible(`body[data-loaded="1"]`),
		chromedp.WaitVisible(`#chart-orders`),
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
		var png []byte
		if err := chromedp.Run(ctx, chromedp.Sleep(8*time.Second), chromedp.FullScreenshot(&png, 100)); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
