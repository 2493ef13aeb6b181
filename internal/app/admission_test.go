package app

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// One admission for every door: the figures of issue 41, against a running ingress (embedded
// NATS, in-process workers) over HTTP.

// submit POSTs body to path of r with headers (name, value pairs) and returns the status and
// the Retry-After.
func submit(t *testing.T, r *running, path string, body []byte, hdrs ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+r.listen+path, bytes.NewReader(body))
	for i := 0; i+1 < len(hdrs); i += 2 {
		req.Header.Set(hdrs[i], hdrs[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0, ""
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// held reads what queue name holds, waiting and scheduled, from the admin API.
func held(t *testing.T, r *running, name string) uint64 {
	t.Helper()
	resp, err := http.Get("http://" + r.admin + "/v1/queues/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var info struct{ Depth, Scheduled uint64 }
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		t.Fatal(err)
	}
	return info.Depth + info.Scheduled
}

// admissionConfig is a config with one queue, q, whose extra settings are queueYAML, that
// drains at 1/h to an upstream that holds every delivery unanswered until the test ends: a
// job delivered stays held (in flight), so what the queue admits is what it holds. unblock
// answers them: register it as a cleanup after start's, so that it runs before the ingress stops.
func admissionConfig(t *testing.T, dir, queueYAML string) (cfg string, unblock func()) {
	rec := workertest.NewRecorder(t)
	block := make(chan struct{})
	rec.Respond(func(workertest.Arrival, int) workertest.Reply { return workertest.Reply{Block: block} })
	return fmt.Sprintf(`listen: %s
admin_listen: %s
data_dir: %s
upstream: %s
queues:
  - name: q
    rate: 1/h
    target: POST %s/jobs
%s`, freeAddr(t), freeAddr(t), filepath.Join(dir, "data"), rec.URL, rec.URL, queueYAML), func() { close(block) }
}

// 200 scheduled jobs of 1 MB into a queue of max_bytes 4 MiB: 429 past 4 MiB; a tenant bound
// to 10 holds with its scheduled jobs counted, while another tenant is accepted; 64
// submitters at once, direct, scheduled and high, against max_depth 200 leave at most 200.
func TestAdmissionEveryDoor(t *testing.T) {
	t.Run("scheduled bytes", func(t *testing.T) {
		dir := t.TempDir()
		cfg, unblock := admissionConfig(t, dir, "    max_bytes: 4194304\n    max_body_bytes: 1048576\n")
		r := start(t, dir, cfg)
		t.Cleanup(unblock)
		body := bytes.Repeat([]byte("x"), 1_000_000)
		var accepted, refused atomic.Int64
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 50 {
					code, ra := submit(t, r, "/v1/queues/q/jobs", body, "Sluice-Delay", "1h")
					switch {
					case code == http.StatusAccepted:
						accepted.Add(1)
					case code == http.StatusTooManyRequests && ra != "":
						refused.Add(1)
					default:
						t.Errorf("submitter %d: %d (Retry-After %q), want 202 or 429 with Retry-After", w, code, ra)
						return
					}
				}
			}()
		}
		wg.Wait()
		t.Logf("200 scheduled jobs of 1 MB into max_bytes 4 MiB: %d accepted (%d bytes of bodies), %d refused with 429",
			accepted.Load(), accepted.Load()*1_000_000, refused.Load())
		if accepted.Load()*1_000_000 > 4<<20 || accepted.Load() < 3 || refused.Load() != 200-accepted.Load() {
			t.Errorf("accepted %d, refused %d: want the bodies within 4 MiB and the rest refused", accepted.Load(), refused.Load())
		}
	})
	t.Run("tenant_max_depth counts scheduled", func(t *testing.T) {
		dir := t.TempDir()
		cfg, unblock := admissionConfig(t, dir, "    tenant: [header:X-API-Key]\n    fair: true\n    pause_scope: tenant\n    tenant_max_depth: 10\n")
		r := start(t, dir, cfg)
		t.Cleanup(unblock)
		accepted := 0
		for i := range 30 {
			h := []string{"X-API-Key", "flood"}
			if i%2 == 1 {
				h = append(h, "Sluice-Delay", "1h")
			}
			code, _ := submit(t, r, "/v1/queues/q/jobs", []byte("x"), h...)
			if code == http.StatusAccepted {
				accepted++
			} else if code != http.StatusTooManyRequests {
				t.Fatalf("job %d: %d, want 202 or 429", i, code)
			}
		}
		code, _ := submit(t, r, "/v1/queues/q/jobs", []byte("x"), "X-API-Key", "other", "Sluice-Delay", "1h")
		t.Logf("tenant_max_depth 10: the flooding tenant got %d of 30 (half scheduled) accepted; another tenant's job: %d", accepted, code)
		if accepted != 10 {
			t.Errorf("the flooding tenant got %d jobs accepted, want tenant_max_depth 10, scheduled counted", accepted)
		}
		if code != http.StatusAccepted {
			t.Errorf("another tenant's job: %d, want 202", code)
		}
	})
	t.Run("64 submitters against max_depth 200", func(t *testing.T) {
		dir := t.TempDir()
		cfg, unblock := admissionConfig(t, dir, "    max_depth: 200\n    priorities: true\n")
		r := start(t, dir, cfg)
		t.Cleanup(unblock)
		var accepted atomic.Int64
		var wg sync.WaitGroup
		for w := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 8 {
					var h []string
					switch (w + i) % 3 {
					case 1:
						h = []string{"Sluice-Delay", "1h"}
					case 2:
						h = []string{"Sluice-Priority", "high"}
					}
					if code, _ := submit(t, r, "/v1/queues/q/jobs", []byte("x"), h...); code == http.StatusAccepted {
						accepted.Add(1)
					} else if code != http.StatusTooManyRequests {
						t.Errorf("submitter %d: %d, want 202 or 429", w, code)
						return
					}
				}
			}()
		}
		wg.Wait()
		n := held(t, r, "q")
		t.Logf("64 submitters × 8 jobs (direct, scheduled, high) against max_depth 200: %d accepted, %d held", accepted.Load(), n)
		if n > 200 || accepted.Load() != 200 {
			t.Errorf("accepted %d, held %d: want exactly max_depth 200 accepted, at most 200 held", accepted.Load(), n)
		}
	})
}

// One API key flooding the quickstart's on_limit: enqueue rule until refused cannot fill the queue:
// it is refused at its own bound, and another key's deferral is still accepted.
func TestAdmissionDeferralFloodLeavesOthers(t *testing.T) {
	dir := t.TempDir()
	cfg, _ := quickstart(t, dir)
	r := start(t, dir, cfg)
	// The key floods until it is refused (its deferral budget, or the queue, is full), or 60 s
	// have passed: on a slow machine the flood takes longer, not fewer jobs.
	var deferred, refused atomic.Int64
	start, stop := time.Now(), time.Now().Add(60*time.Second)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for refused.Load() == 0 && time.Now().Before(stop) {
				switch code, _ := submit(t, r, "/api/orders", []byte(`{"item":1}`), "X-API-Key", "flood", "Content-Type", "application/json"); code {
				case http.StatusAccepted:
					deferred.Add(1)
				case http.StatusTooManyRequests:
					refused.Add(1)
				case http.StatusOK:
				default:
					t.Errorf("flood: %d", code)
					return
				}
			}
		}()
	}
	wg.Wait()
	// Another key: its burst of 2 is forwarded, its third request deferred.
	codes := []int{}
	for range 3 {
		code, _ := submit(t, r, "/api/orders", []byte(`{"item":2}`), "X-API-Key", "other", "Content-Type", "application/json")
		codes = append(codes, code)
	}
	n := held(t, r, "orders")
	t.Logf("one key flooding for %v: %d deferred, %d refused; the queue holds %d; another key then: %v",
		time.Since(start).Round(time.Millisecond), deferred.Load(), refused.Load(), n, codes)
	if n > 1001 || refused.Load() == 0 {
		t.Errorf("the queue holds %d after the flood (%d refused), want the flooding key held to its bound (1 000, other's 1)", n, refused.Load())
	}
	if codes[2] != http.StatusAccepted {
		t.Errorf("another key's deferral: %d, want 202", codes[2])
	}
}

// A rule's max_waiting_per_key holds one key to that many waiting deferrals (429 naming the
// rule), while another key's are deferred.
func TestAdmissionDeferralBudget(t *testing.T) {
	dir := t.TempDir()
	cfg, unblock := admissionConfig(t, dir, "")
	cfg += `rules:
  - name: all-deferred
    match: { methods: [POST], path: /api/* }
    key: [header:X-API-Key]
    action: enqueue
    queue: q
    max_waiting_per_key: 3
`
	r := start(t, dir, cfg)
	t.Cleanup(unblock)
	var codes []int
	for range 5 {
		code, _ := submit(t, r, "/api/x", []byte("x"), "X-API-Key", "a")
		codes = append(codes, code)
	}
	other, _ := submit(t, r, "/api/x", []byte("x"), "X-API-Key", "b")
	t.Logf("max_waiting_per_key 3: key a got %v, key b %d", codes, other)
	if fmt.Sprint(codes) != "[202 202 202 429 429]" || other != http.StatusAccepted {
		t.Errorf("key a: %v, key b: %d; want 3 deferred, then 429, and b deferred", codes, other)
	}
}
