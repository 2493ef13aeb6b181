package ingress

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/testenv"
)

const owedOnceYAML = `
store_timeout: 300ms
rules:
  - name: llm
    match: {path: /v1/messages}
    key: [header:Authorization]
    algorithm: token_bucket
    budgets:
      - {name: input, limit: 1000, period: 100s, cost: 'json:/in', cost_from_response: 'json:/usage/input_tokens'}
      - {name: output, limit: 1000, period: 100s, cost: 'json:/out', cost_from_response: 'json:/usage/output_tokens'}
`

// TestOwedChargeOnceAfterStall (issue 39): an extra charge whose Adjust reached a stopped
// redis-server (SIGSTOP) fails and is kept; the server runs it when it resumes (SIGCONT), and
// the owed charge made after the next Adjust that succeeds finds it made (its ChargeID
// recorded) and charges nothing more: sluice_rule_owed_charges_total{result="made"} = 1, and
// the key owes the 500 once. Before, it was charged twice: the last request was refused.
func TestOwedChargeOnceAfterStall(t *testing.T) {
	u := &usageUpstream{held: make(chan struct{}), release: make(chan struct{})}
	rs := testenv.Redis(t)
	url, reg := budgetServer(t, u, rs, owedOnceYAML)

	// An extra charge of 50 that succeeds: the server knows the adjustment script (a stalled
	// EVALSHA of one it did not know would answer NOSCRIPT, charging nothing).
	if res, b := post(t, url, `{"in":1,"out":100,"true_in":1,"true_out":150}`); res.StatusCode != http.StatusOK {
		t.Fatalf("first: status %d %s", res.StatusCode, b)
	}
	waitMetric(t, reg, 50, "sluice_rule_units_reconciled_total", "rule", "llm/output", "direction", "charge")

	done := make(chan struct{})
	go func() {
		defer close(done)
		// Charged 100 output tokens; the answer says 600: 500 more, while Redis is stopped.
		if res, b := post(t, url, `{"in":1,"out":100,"true_in":1,"true_out":600,"hold":true}`); res.StatusCode != http.StatusOK {
			t.Errorf("held request: status %d %s", res.StatusCode, b)
		}
	}()
	<-u.held
	calls := evalshaCalls(t, rs.Client)
	rs.Pause()
	close(u.release)
	<-done
	waitMetric(t, reg, 1, "sluice_rule_owed_charges_total", "result", "kept")
	rs.Resume()
	testenv.WaitFor(t, 5*time.Second, "the stalled EVALSHA to run", func() bool {
		return evalshaCalls(t, rs.Client) > calls
	})

	// The next Adjust that succeeds (a refund of 50) makes the owed charge: found made.
	if res, b := post(t, url, `{"in":1,"out":100,"true_in":1,"true_out":50}`); res.StatusCode != http.StatusOK {
		t.Fatalf("after the stall: status %d %s", res.StatusCode, b)
	}
	waitMetric(t, reg, 1, "sluice_rule_owed_charges_total", "result", "made")
	if got := metric(t, reg, "sluice_rule_owed_charges"); got != 0 {
		t.Errorf("owed charges kept: %v, want 0", got)
	}
	if got := metric(t, reg, "sluice_rule_owed_charges_total", "result", "paid"); got != 0 {
		t.Errorf("owed charges paid again: %v, want 0 (the first call ran)", got)
	}
	// 1000 - 150 - 600 - 50 = 200 output tokens left (and a few refilled at 10 a second): a
	// request of 200 is admitted; had the 500 been charged twice, -300 would be left.
	if res, b := post(t, url, `{"in":1,"out":200,"true_in":1,"true_out":200}`); res.StatusCode != http.StatusOK {
		t.Fatalf("last: status %d %s, want 200 (the extra 500 charged once)", res.StatusCode, b)
	}
	t.Logf("units charged on reconciliation: %v (50 + 500)",
		metric(t, reg, "sluice_rule_units_reconciled_total", "rule", "llm/output", "direction", "charge"))
	if got := metric(t, reg, "sluice_rule_units_reconciled_total", "rule", "llm/output", "direction", "charge"); got != 550 {
		t.Errorf("output units charged on reconciliation: %v, want 550 (50, and 500 once)", got)
	}
}

// evalshaCalls is how many EVALSHA calls the server has run (INFO commandstats).
func evalshaCalls(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(info, "cmdstat_evalsha:calls=")
	if !ok {
		return 0
	}
	n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
	return n
}
