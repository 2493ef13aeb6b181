package ingress

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/queue"
)

// Who may claim priority: a table of who asks for what on which queue, and the level the job
// is stored at (read back from the level's consumer), or the refusal.
func TestPriorityClaims(t *testing.T) {
	f := newQueueFixture(t, `
queues:
  - name: claims
    rate: 1/s
    target: 'POST http://upstream.invalid/x'
    tenant: [header:X-API-Key]
    priorities: { high: [tenant:gold, header:X-Tier=gold, rule:urgent] }
  - name: strict
    rate: 1/s
    target: 'POST http://upstream.invalid/x'
    tenant: [header:X-API-Key]
    priorities: { high: [tenant:gold], others: refuse }
  - name: open
    rate: 1/s
    target: 'POST http://upstream.invalid/x'
    priorities: true
rules:
  - { name: urgent, match: { methods: [POST], path: /urgent }, key: [header:X-API-Key], action: enqueue, queue: claims }
  - { name: plain, match: { methods: [POST], path: /plain }, key: [header:X-API-Key], action: enqueue, queue: claims }
`)
	for _, row := range []struct {
		name, path string
		hdr        []string
		want       queue.Priority // "refused": 403
		refused    bool
	}{
		{"a named tenant asks high", "/v1/queues/claims/jobs", []string{"X-API-Key", "gold", "Sluice-Priority", "high"}, queue.PriorityHigh, false},
		{"another tenant asks high: normal", "/v1/queues/claims/jobs", []string{"X-API-Key", "silver", "Sluice-Priority", "high"}, queue.PriorityNormal, false},
		{"a named header value asks high", "/v1/queues/claims/jobs", []string{"X-API-Key", "silver", "X-Tier", "gold", "Sluice-Priority", "high"}, queue.PriorityHigh, false},
		{"the header value, once of two: normal", "/v1/queues/claims/jobs", []string{"X-API-Key", "silver", "X-Tier", "gold", "X-Tier", "bronze", "Sluice-Priority", "high"}, queue.PriorityNormal, false},
		{"anyone asks low", "/v1/queues/claims/jobs", []string{"X-API-Key", "silver", "Sluice-Priority", "low"}, queue.PriorityLow, false},
		{"others refused", "/v1/queues/strict/jobs", []string{"X-API-Key", "silver", "Sluice-Priority", "high"}, "", true},
		{"the named tenant of a strict queue", "/v1/queues/strict/jobs", []string{"X-API-Key", "gold", "Sluice-Priority", "high"}, queue.PriorityHigh, false},
		{"priorities: true takes anyone's", "/v1/queues/open/jobs", []string{"Sluice-Priority", "high"}, queue.PriorityHigh, false},
		{"a deferral by a named rule", "/urgent", []string{"X-API-Key", "silver"}, queue.PriorityHigh, false},
		{"a deferral by another rule", "/plain", []string{"X-API-Key", "silver", "Sluice-Priority", "high"}, queue.PriorityNormal, false},
	} {
		res := f.do("POST", row.path, strings.NewReader("x"), row.hdr...)
		if row.refused {
			if p := readProblem(t, res, http.StatusForbidden); !strings.Contains(p.Detail, "high only from") {
				t.Errorf("%s: 403 detail %q", row.name, p.Detail)
			}
			continue
		}
		var a Accepted
		if res.StatusCode != http.StatusAccepted || json.NewDecoder(res.Body).Decode(&a) != nil {
			t.Fatalf("%s: status %d, want 202", row.name, res.StatusCode)
		}
		if got, ok := f.levelOf(a.Queue, a.ID); !ok || got != row.want {
			t.Errorf("%s: stored at %q (found %v), want %q", row.name, got, ok, row.want)
		}
		downgraded := strings.Contains(strings.Join(row.hdr, " "), "Sluice-Priority high") && row.want == queue.PriorityNormal && !strings.HasPrefix(row.path, "/plain")
		if h := res.Header.Get("Sluice-Priority"); downgraded != (h == "normal") {
			t.Errorf("%s: 202 Sluice-Priority %q, want normal only for a claim not granted", row.name, h)
		}
	}
}

// levelOf takes job id from queue name's level consumers and returns the level it waited at.
func (f *queueFixture) levelOf(name, id string) (queue.Priority, bool) {
	f.t.Helper()
	for _, p := range queue.Priorities {
		c, err := f.qs.LevelConsumer(f.ctx, name, p)
		if err != nil {
			f.t.Fatal(err)
		}
		msgs, err := c.Fetch(f.ctx, 10, 200*time.Millisecond)
		if err != nil {
			f.t.Fatal(err)
		}
		for _, m := range msgs {
			_ = m.Ack(f.ctx)
			if m.Job.ID == id {
				return m.Job.Priority, true
			}
		}
	}
	return "", false
}

// A queue with tenants and no pause_scope is told at start what one tenant's 429 does.
func TestWarnsTenantsWithoutPauseScope(t *testing.T) {
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(b []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(b)
	}), nil))
	cfg := parseConfig(t, "http://127.0.0.1:1", "queues:\n  - {name: shared, rate: 1/s, tenant: [header:X-API-Key]}\n")
	srv, err := New(cfg, Options{Logger: log, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), `pauses every tenant of the queue for its Retry-After`) || !strings.Contains(logs.String(), `\"shared\"`) {
		t.Fatalf("log %q: want the pause_scope warning about queue shared at start", logs.String())
	}
}
