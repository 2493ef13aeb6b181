package ingress

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestQuietLog: a failure that repeats is logged once per quietEvery per key, the next line
// counting the ones left out; another key is logged on its own.
func TestQuietLog(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var q quietLog
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 50 { // 5 s of failures of orders, one every 100 ms
		q.error(log, t0.Add(time.Duration(i)*100*time.Millisecond), "orders", "enqueue failed", "queue", "orders")
	}
	q.error(log, t0.Add(time.Second), "reports", "enqueue failed", "queue", "reports")
	q.error(log, t0.Add(quietEvery), "orders", "enqueue failed", "queue", "orders")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 || strings.Contains(lines[0], "not_logged") || !strings.Contains(lines[1], "queue=reports") ||
		!strings.Contains(lines[2], "not_logged_since_last=49") {
		t.Fatalf("logged:\n%s", buf.String())
	}
}
