package ingress

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/limit"
)

// usageUpstream answers each request with the usage its body asks for: {"true_in": N,
// "true_out": M} comes back as {"usage": {"input_tokens": N, "output_tokens": M}}. A request
// whose body has "hold": true waits, after held is signalled, until release is closed.
type usageUpstream struct {
	held    chan struct{}
	release chan struct{}
}

func (u *usageUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		TrueIn  int64 `json:"true_in"`
		TrueOut int64 `json:"true_out"`
		Hold    bool  `json:"hold"`
	}
	json.NewDecoder(r.Body).Decode(&req)
	if req.Hold {
		u.held <- struct{}{}
		<-u.release
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"usage":{"input_tokens":%d,"output_tokens":%d}}`, req.TrueIn, req.TrueOut)
}

// budgetServer starts an ingress for yaml (upstream u) over rs, and returns its URL and metrics.
func budgetServer(t *testing.T, u *usageUpstream, rs *testenv.RedisServer, yaml string) (string, *prometheus.Registry) {
	t.Helper()
	us := httptest.NewServer(u)
	t.Cleanup(us.Close)
	reg := prometheus.NewRegistry()
	srv, err := New(parseConfig(t, us.URL, yaml), Options{
		Limiter:    limit.NewRedis(storeClient(t, rs), limit.RedisConfig{Prefix: testenv.Prefix(t)}),
		Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	ing := httptest.NewServer(srv.Handler())
	t.Cleanup(ing.Close)
	return ing.URL, reg
}

// post sends body to the ingress at url as key k and returns the answer, its body read.
func post(t *testing.T, url string, body string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/messages", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer k")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res, b
}

// waitMetric waits until the metric reads want.
func waitMetric(t *testing.T, reg prometheus.Gatherer, want float64, name string, labels ...string) {
	t.Helper()
	testenv.WaitFor(t, 5*time.Second, fmt.Sprintf("%s%v = %v", name, labels, want), func() bool {
		return metric(t, reg, name, labels...) == want
	})
}

const budgetsYAML = `
store_timeout: 2s
rules:
  - name: llm
    match: {path: /v1/messages}
    key: [header:Authorization]
    algorithm: token_bucket
    budgets:
      - {name: input, limit: 1000, period: 100s, cost: 'json:/in', cost_from_response: 'json:/usage/input_tokens'}
      - {name: output, limit: 1000, period: 100s, cost: 'json:/out', cost_from_response: 'json:/usage/output_tokens'}
`

// A rule with input and output budgets (Redis): a request passes only when both admit it;
// when one refuses, the other's charge is given back at once, and the 429 names the budget
// that refused, with its Retry-After. Each budget is reconciled from its own usage field.
func TestBudgetsRefuseTogether(t *testing.T) {
	u := &usageUpstream{}
	url, reg := budgetServer(t, u, testenv.Redis(t), budgetsYAML)

	// 900 input and 100 output: both admit. The answer reports 900 and 100: nothing to adjust.
	if res, b := post(t, url, `{"in":900,"out":100,"true_in":900,"true_out":100}`); res.StatusCode != http.StatusOK {
		t.Fatalf("first: status %d %s", res.StatusCode, b)
	}
	// 200 input (100 left: refused) and 500 output (900 left: admitted, then given back).
	res, b := post(t, url, `{"in":200,"out":500}`)
	if res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second: status %d %s, want 429", res.StatusCode, b)
	}
	pol := readPolicy(t, res.Header)
	if pol.name != "llm/input" || pol.q != 1000 || pol.r > 100 {
		t.Errorf("the 429's policy %+v, want llm/input with about 100 left", pol)
	}
	var p problemBody
	json.Unmarshal(b, &p)
	if len(p.ViolatedPolicies) != 1 || p.ViolatedPolicies[0] != "llm/input" {
		t.Errorf("violated-policies %v, want [llm/input]", p.ViolatedPolicies)
	}
	// 100 more input tokens at 10 a second: about 10 s.
	if ra, _ := strconv.Atoi(res.Header.Get("Retry-After")); ra < 9 || ra > 11 {
		t.Errorf("Retry-After %q, want about 10 (the input budget's)", res.Header.Get("Retry-After"))
	}
	if got := metric(t, reg, "sluice_budget_refunds_total", "rule", "llm/output", "result", "refunded"); got != 500 {
		t.Errorf("units given back to llm/output: %v, want 500", got)
	}
	// 50 input and 900 output: admitted only if the 500 were given back (900 left, not 400).
	// The answer reports 20 and 950: 30 refunded to input, 50 charged to output.
	if res, b := post(t, url, `{"in":50,"out":900,"true_in":20,"true_out":950}`); res.StatusCode != http.StatusOK {
		t.Fatalf("third: status %d %s, want 200 (the refused request's output charge given back)", res.StatusCode, b)
	}
	waitMetric(t, reg, 30, "sluice_rule_units_reconciled_total", "rule", "llm/input", "direction", "refund")
	waitMetric(t, reg, 50, "sluice_rule_units_reconciled_total", "rule", "llm/output", "direction", "charge")
	// The output budget now owes: 1000 - 100 - 950 = -50, so a request of 1 output token is
	// refused by it, and the 429 names it.
	res, b = post(t, url, `{"in":1,"out":1}`)
	if res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("in debt: status %d %s, want 429", res.StatusCode, b)
	}
	if pol := readPolicy(t, res.Header); pol.name != "llm/output" {
		t.Errorf("in debt: policy %q, want llm/output", pol.name)
	}
	if got := metric(t, reg, "sluice_budget_refunds_total", "rule", "llm/input", "result", "refunded"); got != 1 {
		t.Errorf("units given back to llm/input: %v, want 1", got)
	}
}

// An extra charge that the store fails (Redis down when the answer comes) is kept and made
// once the store answers again, instead of being forgiven.
func TestOwedChargeMadeAfterStoreReturns(t *testing.T) {
	u := &usageUpstream{held: make(chan struct{}), release: make(chan struct{})}
	rs := testenv.Redis(t)
	url, reg := budgetServer(t, u, rs, budgetsYAML)

	done := make(chan struct{})
	go func() {
		defer close(done)
		// Charged 100 output tokens; the answer says 600: 500 owed.
		if res, b := post(t, url, `{"in":1,"out":100,"true_in":1,"true_out":600,"hold":true}`); res.StatusCode != http.StatusOK {
			t.Errorf("held request: status %d %s", res.StatusCode, b)
		}
	}()
	<-u.held
	rs.Stop()
	close(u.release)
	<-done
	waitMetric(t, reg, 1, "sluice_rule_owed_charges_total", "result", "kept")
	if got := metric(t, reg, "sluice_rule_owed_charges"); got != 1 {
		t.Errorf("owed charges kept: %v, want 1", got)
	}
	rs.Start() // an empty dataset: the key starts full

	// The next adjustment that succeeds (a refund of 50 output tokens) makes the owed charge.
	if res, b := post(t, url, `{"in":1,"out":100,"true_in":1,"true_out":50}`); res.StatusCode != http.StatusOK {
		t.Fatalf("after the restart: status %d %s", res.StatusCode, b)
	}
	waitMetric(t, reg, 1, "sluice_rule_owed_charges_total", "result", "paid")
	if got := metric(t, reg, "sluice_rule_owed_charges"); got != 0 {
		t.Errorf("owed charges kept after payment: %v, want 0", got)
	}
	// 1000 - 100 + 50 - 500 = 450 output tokens left (and a few refilled at 10 a second): a
	// request of 600 is refused; it would have been admitted had the 500 been forgiven.
	if res, b := post(t, url, `{"in":1,"out":600}`); res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("after payment: status %d %s, want 429 (the owed 500 charged)", res.StatusCode, b)
	}
}

// For every algorithm (in memory, at a fixed instant): a request that the second budget
// refuses leaves nothing on the first. The first has 9 of 10 units left; a request of 9 is
// refused by the second budget, and once the second has refilled, a request of 9 is admitted
// by the first, which it would not be had the refused request kept its charge.
func TestBudgetRefundEveryAlgorithm(t *testing.T) {
	for _, alg := range limit.Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			f := newFixture(t, fmt.Sprintf(`
rules:
  - name: llm
    key: [header:Authorization]
    budgets:
      - {name: a, algorithm: %s, limit: 10, period: 1000h, burst: 10, cost: 'header:X-A'}
      - {name: b, algorithm: token_bucket, limit: 5, period: 1s, cost: 'header:X-B'}
`, alg), Options{})
			send := func(a, b int) *http.Response {
				res := f.do("GET", "/x", nil, "Authorization", "Bearer k", "X-A", strconv.Itoa(a), "X-B", strconv.Itoa(b))
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				return res
			}
			if res := send(1, 5); res.StatusCode != http.StatusOK {
				t.Fatalf("first: status %d", res.StatusCode)
			}
			res := send(9, 5)
			if res.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("second: status %d, want 429 from b", res.StatusCode)
			}
			if pol := readPolicy(t, res.Header); pol.name != "llm/b" {
				t.Errorf("second: policy %q, want llm/b", pol.name)
			}
			f.clock.Advance(time.Second) // b is full again; a refills 10 per 1000h: nothing to speak of
			if res := send(9, 5); res.StatusCode != http.StatusOK {
				t.Fatalf("third: status %d, want 200 (a's 9 given back when b refused)", res.StatusCode)
			}
		})
	}
}
