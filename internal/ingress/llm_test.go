package ingress

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/limit"
)

// llmUpstream is a recording LLM-like upstream: it answers a chat completion with usage, its
// prompt tokens counted at one token per 3 bytes of the messages (a tokenizer less thrifty
// than the ingress's estimate) and its completion tokens max_tokens at most, and records what
// it served and when.
type llmUpstream struct {
	mu     sync.Mutex
	served []served
}

type served struct {
	at     time.Time
	tokens int64
}

func (u *llmUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Messages  json.RawMessage `json:"messages"`
		MaxTokens int64           `json:"max_tokens"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	prompt := (int64(len(req.Messages)) + 2) / 3
	completion := min(req.MaxTokens, 1)
	u.mu.Lock()
	u.served = append(u.served, served{time.Now(), prompt + completion})
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"c","usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
		prompt, completion, prompt+completion)
}

// most is the most tokens served in any span of d.
func (u *llmUpstream) most(d time.Duration) (most int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for i, s := range u.served {
		var sum int64
		for _, o := range u.served[i:] {
			if o.at.Sub(s.at) < d {
				sum += o.tokens
			}
		}
		most = max(most, sum)
	}
	return most
}

// overBucket returns the first span of served answers whose tokens exceed a token bucket's
// bound, capacity + rate × the span's length + slack (docs/llm.md, "debt"), as a description;
// "" when none does.
func (u *llmUpstream) overBucket(capacity, slack int64, period time.Duration) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	for i := range u.served {
		var sum int64
		for _, o := range u.served[i:] {
			sum += o.tokens
			span := o.at.Sub(u.served[i].at)
			if bound := capacity + int64(float64(capacity)*span.Seconds()/period.Seconds()) + slack; sum > bound {
				return fmt.Sprintf("%d tokens served in %v; bound %d (capacity + rate × span + the in-flight estimate error)", sum, span, bound)
			}
		}
	}
	return ""
}

// 60 concurrent requests of one key, each declaring max_tokens 1 with a 64 000-character
// prompt, against a key budget of 20 000 tokens per 2 s (Redis): the entry charge (the prompt
// estimate plus the completion bound) admits one, the answer's usage puts the key in debt,
// and the key is refused, with a Retry-After that pays the debt back, until it is paid. The
// tokens served in any period stay within the budget plus the in-flight estimate error.
func TestLLMKeyBudgetHolds(t *testing.T) {
	up := &llmUpstream{}
	us := httptest.NewServer(up)
	t.Cleanup(us.Close)
	const budget, period = 20000, 2 * time.Second
	yaml := fmt.Sprintf(`
store_timeout: 2s  # the machine is shared: an adjustment that times out would leave the estimate standing
rules:
  - name: tokens
    match: {path: /v1/chat/completions}
    key: [header:Authorization]
    algorithm: token_bucket
    limit: %d
    period: %s
    cost: max(json:/max_completion_tokens, json:/max_tokens, 16) + prompt_tokens(json:/messages, 4)
    cost_from_response: json:/usage/total_tokens
`, budget, period)
	rs := testenv.Redis(t)
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

	body, _ := json.Marshal(map[string]any{
		"model":      "m",
		"max_tokens": 1,
		"messages":   []map[string]string{{"role": "user", "content": strings.Repeat("a", 64000)}},
	})
	messages := int64(len(`[{"content":"","role":"user"}]`) + 64000)
	charge := 16 + (messages+3)/4 // the entry charge
	truth := (messages+2)/3 + 1   // what the upstream counts
	send := func() *http.Response {
		req, _ := http.NewRequest("POST", ing.URL+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer k")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return nil
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res
	}
	var wg sync.WaitGroup
	codes := make(chan int, 60)
	for range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if res := send(); res != nil {
				codes <- res.StatusCode
			}
		}()
	}
	wg.Wait()
	close(codes)
	count := map[int]int{}
	for c := range codes {
		count[c]++
	}
	if count[http.StatusOK] != 1 || count[http.StatusTooManyRequests] != 59 {
		t.Fatalf("answers %v, want one 200 and 59 429s", count)
	}
	servedAt := up.served[0].at
	// The answer's usage is reconciled after it was passed on: wait for it.
	deadline := time.Now().Add(5 * time.Second)
	for metric(t, reg, "sluice_rule_units_reconciled_total", "rule", "tokens", "direction", "charge") != float64(truth-charge) {
		if time.Now().After(deadline) {
			t.Fatalf("the answer's %d tokens above the charge of %d were not charged", truth-charge, charge)
		}
		time.Sleep(time.Millisecond) // polling a condition
	}
	// In debt: refused with the Retry-After that pays the debt and this request's charge back.
	res := send()
	if res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("in debt: status %d, want 429", res.StatusCode)
	}
	retry, _ := strconv.Atoi(res.Header.Get("Retry-After"))
	// The bucket refills while the 429s are answered: on a loaded machine that takes a while.
	owed := truth - budget // beyond a full bucket
	refilled := time.Since(servedAt)
	if min := time.Duration(owed+charge)*period/budget - refilled; time.Duration(retry)*time.Second < min.Truncate(time.Second) {
		t.Errorf("Retry-After %ds; paying %d owed and %d charged back takes at least %v after the %v refilled since", retry, owed, charge, min, refilled)
	}
	if over := up.overBucket(budget, truth-charge, period); over != "" {
		t.Error(over)
	}
	// Once paid, the key is served again.
	time.Sleep(time.Duration(retry) * time.Second) // the Retry-After the ingress gave, as a client waits
	if res := send(); res.StatusCode != http.StatusOK {
		t.Fatalf("after Retry-After: status %d, want 200", res.StatusCode)
	}
	if over := up.overBucket(budget, truth-charge, period); over != "" {
		t.Error(over)
	}
	t.Logf("served %d tokens in the busiest %v (budget %d, charge %d, truth %d, Retry-After %ds)",
		up.most(period), period, budget, charge, truth, retry)
}
