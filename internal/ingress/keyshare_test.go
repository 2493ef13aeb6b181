package ingress

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/limit"
)

// TestKeyFloodLeavesOtherRules floods a cheap rule of the in-memory store with keys, then
// checks that new clients of another rule each get their full allowance. Before, the flood
// filled the store and every new login client shared one overflow bucket (20 clients got 3
// requests between them).
func TestKeyFloodLeavesOtherRules(t *testing.T) {
	mem := limit.NewMemory(limit.MemoryConfig{MaxKeys: 400, Shards: 1, Now: func() time.Time { return epoch }})
	f := newFixture(t, `
rules:
  - {name: search, match: {path: /search}, key: [query:q], algorithm: fixed_window, limit: 1, period: 1h}
  - {name: login, match: {path: /login}, algorithm: sliding_log, limit: 3, period: 1h}
`, Options{Limiter: mem})
	for i := range 2000 {
		f.do("GET", fmt.Sprintf("/search?q=%d", i), nil)
	}
	for c := range 20 {
		f.peerAddr = fmt.Sprintf("198.51.100.%d:5000", c+1)
		for i := range 3 {
			if res := f.do("POST", "/login", nil); res.StatusCode != http.StatusOK {
				t.Fatalf("login client %d request %d: %d, want 200: its own 3 requests", c, i+1, res.StatusCode)
			}
		}
		if res := f.do("POST", "/login", nil); res.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("login client %d request 4: %d, want 429", c, res.StatusCode)
		}
	}
}
