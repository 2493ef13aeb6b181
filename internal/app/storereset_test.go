package app

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// TestStoreResetThroughIngress: two token-bucket rules of 2 requests per 2s, one with
// on_store_reset: hold and one allow, each used up; the redis-server is then SIGKILLed
// and restarted without persistence. The fresh rule's key is admitted again at once (its
// bucket starts afresh, long before it would have refilled); the conservative rule's key is
// refused with 429 until its period has passed since the restart, then admitted. The loss is
// counted once in sluice_limit_store_resets_total.
func TestStoreResetThroughIngress(t *testing.T) {
	rs := testenv.Redis(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(up.Close)
	const period = 2 * time.Second
	dir := t.TempDir()
	in := start(t, dir, `listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
data_dir: `+dir+` # no nats section: the embedded server's store
upstream: `+up.URL+`
redis: { url: `+rs.URL()+` }
store_timeout: 1s
on_store_error: deny # a store error is a 503 here, never an admission
rules:
  - { name: careful, match: { path: /c/* }, key: [const:k], algorithm: token_bucket, limit: 2, period: 2s, on_store_reset: hold }
  - { name: hasty, match: { path: /f/* }, key: [const:k], algorithm: token_bucket, limit: 2, period: 2s, on_store_reset: allow }
`)
	get := func(path string) int {
		resp, err := http.Get("http://" + in.listen + path)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, p := range []string{"/c/x", "/f/x"} {
		// Two of 2: used up. No third request: its refusal would be cached by the ingress
		// until its Retry-After, whatever the store says after the restart.
		for i, want := range []int{200, 200} {
			if got := get(p); got != want {
				t.Fatalf("%s request %d before the restart: %d, want %d", p, i+1, got, want)
			}
		}
	}
	usedUp := time.Now()

	rs.Stop()
	rs.Start()
	restarted := time.Now()
	var fresh int
	testenv.WaitFor(t, 5*time.Second, "the ingress to reach the restarted Redis", func() bool {
		fresh = get("/f/x")
		return fresh != 503
	})
	if fresh != 200 || time.Since(usedUp) >= period {
		t.Fatalf("fresh rule after the restart: %d %v after its key was used up, want 200 within %v", fresh, time.Since(usedUp), period)
	}
	if got := get("/c/x"); got != 429 {
		t.Fatalf("conservative rule right after the restart: %d, want 429", got)
	}
	var admitted time.Duration
	testenv.WaitFor(t, period+3*time.Second, "the conservative rule to admit again", func() bool {
		if get("/c/x") != 200 {
			return false
		}
		admitted = time.Since(restarted)
		return true
	})
	if admitted < period-10*time.Millisecond {
		t.Errorf("conservative rule admitted %v after the restart, want ≥ %v", admitted, period)
	}
	t.Logf("conservative rule admitted again %v after the restart (period %v); fresh rule at once", admitted.Round(time.Millisecond), period)
	resp, err := http.Get("http://" + in.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "\nsluice_limit_store_resets_total 1\n") {
		t.Errorf("metrics lack sluice_limit_store_resets_total 1")
	}
}
