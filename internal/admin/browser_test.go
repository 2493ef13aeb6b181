package admin

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// browser returns a headless chromium that resolves the name rebind.test to 127.0.0.1, as a
// rebinding DNS server would.
func browser(t *testing.T) context.Context {
	t.Helper()
	return testenv.Browser(t, 30*time.Second, chromedp.Flag("host-resolver-rules", "MAP rebind.test 127.0.0.1"))
}

// TestCrossSiteFormInBrowser: in real headless chromium, a page on another loopback origin
// (127.0.0.2, and another port of 127.0.0.1) that auto-submits a form POST to the admin
// pause endpoint does not pause the queue: the admin listener refuses it (counted as a
// refused pause). A page under a rebound name cannot read a job either.
func TestCrossSiteFormInBrowser(t *testing.T) {
	e := newOpsEnv(t, "", nil)
	ctx := browser(t) // closed first, so that the listener's shutdown waits on no socket of it
	page := fmt.Sprintf(`<!doctype html><form id="f" method="POST" action="http://%s/v1/queues/orders/pause">
<input name="for" value="1h"></form><script>document.getElementById("f").submit()</script>`, e.addr)

	for i, host := range []string{"127.0.0.2", "127.0.0.1"} {
		evil := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprint(w, page)
		}))
		ln, err := net.Listen("tcp", host+":0")
		if err != nil {
			t.Fatal(err)
		}
		evil.Listener.Close()
		evil.Listener = ln
		evil.Start()
		t.Cleanup(evil.Close)

		if err := chromedp.Run(ctx, chromedp.Navigate(evil.URL)); err != nil {
			t.Fatalf("loading the page at %s: %v", evil.URL, err)
		}
		refused := func() float64 {
			return testenv.Metric(t, e.reg, "sluice_admin_writes_total", "action", "pause", "result", "refused")
		}
		testenv.WaitFor(t, 10*time.Second, "the form's POST reaches the admin listener", func() bool {
			return refused() > float64(i) || e.paused(t)
		})
		if e.paused(t) {
			t.Fatalf("a form on %s paused the queue", evil.URL)
		}
		if n := refused(); n != float64(i+1) {
			t.Fatalf("refused pauses: %v, want %d", n, i+1)
		}
	}

	// A page whose name now resolves to the listener gets 403 for a job's status.
	var text string
	if err := chromedp.Run(ctx,
		chromedp.Navigate("http://rebind.test:"+port(e.addr)+"/v1/jobs/"+e.jobID),
		chromedp.Text("body", &text),
	); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, `"status":403`) || strings.Contains(text, e.jobID) {
		t.Errorf("a job read under a rebound name: %s", text)
	}
}
