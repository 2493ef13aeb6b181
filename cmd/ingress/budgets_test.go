package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// anthropicUpstream is an LLM-like upstream that enforces input and output token budgets of
// its own, as Anthropic's API does (ITPM and OTPM), over a trailing second: a request that
// would take either above its limit is answered 429 with the remaining tokens, and served
// otherwise. Input tokens are one per 3 bytes of the messages, of which a third are reported
// as read from the prompt cache (cache_read_input_tokens) and a tenth as written to it
// (cache_creation_input_tokens); like Anthropic's, its input budget counts input_tokens and
// cache_creation_input_tokens, not cache reads. Output tokens are 30 to 100% of max_tokens.
type anthropicUpstream struct {
	url           string
	inLimit, outL int64

	mu      sync.Mutex
	rng     *rand.Rand
	log     []use // served, in order
	refused int
}

type use struct {
	at      time.Time
	in, out int64
}

func newAnthropicUpstream(t *testing.T, inLimit, outLimit int64) *anthropicUpstream {
	u := &anthropicUpstream{inLimit: inLimit, outL: outLimit, rng: rand.New(rand.NewPCG(40, 4))}
	srv := &http.Server{Handler: u}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.url = "http://" + ln.Addr().String()
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return u
}

func (u *anthropicUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		MaxTokens int64           `json:"max_tokens"`
		Messages  json.RawMessage `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	total := (int64(len(req.Messages)) + 2) / 3
	cacheRead, cacheWrite := total/3, total/10
	input := total - cacheRead - cacheWrite
	now := time.Now()
	u.mu.Lock()
	out := req.MaxTokens * (30 + u.rng.Int64N(71)) / 100
	var inUsed, outUsed int64
	for i := len(u.log) - 1; i >= 0 && now.Sub(u.log[i].at) < time.Second; i-- {
		inUsed += u.log[i].in
		outUsed += u.log[i].out
	}
	counted := input + cacheWrite
	if inUsed+counted > u.inLimit || outUsed+out > u.outL {
		u.refused++
		u.mu.Unlock()
		w.Header().Set("anthropic-ratelimit-input-tokens-remaining", fmt.Sprint(max(0, u.inLimit-inUsed)))
		w.Header().Set("anthropic-ratelimit-output-tokens-remaining", fmt.Sprint(max(0, u.outL-outUsed)))
		w.Header().Set("Retry-After", "1")
		http.Error(w, `{"type":"error","error":{"type":"rate_limit_error"}}`, http.StatusTooManyRequests)
		return
	}
	u.log = append(u.log, use{now, counted, out})
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"type":"message","usage":{"input_tokens":%d,"cache_creation_input_tokens":%d,"cache_read_input_tokens":%d,"output_tokens":%d}}`,
		input, cacheWrite, cacheRead, out)
}

// served returns the input and output tokens served from..to, and the requests served and
// refused in all.
func (u *anthropicUpstream) served(from, to time.Time) (in, out int64, n, refused int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, s := range u.log {
		if !s.at.Before(from) && s.at.Before(to) {
			in += s.in
			out += s.out
		}
	}
	return in, out, len(u.log), u.refused
}

// TestSeparateBudgetsHoldAtUpstream: an ingress process with a rule of two budgets (input and
// output tokens, token buckets over one second, Redis) in front of an upstream that enforces
// separate input and output budgets itself. Six clients send as fast as the ingress lets
// them for 3 s. Both budgets hold at the upstream (at most 1% of its answers are 429s) while
// at least 85% of the binding budget, output, is used.
//
// The ingress's budgets (burst + rate per second) are 97.5% and 96.7% of the upstream's, the
// margin for the time between the ingress's admission and the upstream's count. The entry charges bound
// the truth (input: 2 bytes per token, the upstream counts 3, cache reads included; output:
// max_tokens), and each budget is reconciled from its own usage field.
func TestSeparateBudgetsHoldAtUpstream(t *testing.T) {
	rs := testenv.Redis(t)
	ns := testenv.NATS(t)
	const upIn, upOut = 12000, 4000 // the upstream's, per second
	const inRate, inBurst = 9600, 2000
	const outRate, outBurst = 3500, 400
	const maxTokens = 200
	up := newAnthropicUpstream(t, upIn, upOut)
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	cfg := fmt.Sprintf(`upstream: %s
redis: { url: %q }
nats: { url: %q }
store_timeout: 1s
rules:
  - name: llm
    match: { methods: [POST], path: /v1/messages }
    key: [header:X-Api-Key]
    algorithm: token_bucket
    budgets:
      - name: input
        limit: %d
        period: 1s
        burst: %d
        cost: prompt_tokens(json:/messages)
        cost_from_response: json:/usage/input_tokens + json:/usage/cache_creation_input_tokens
      - name: output
        limit: %d
        period: 1s
        burst: %d
        cost: json:/max_tokens
        cost_from_response: json:/usage/output_tokens
`, up.url, rs.URL(), ns.URL, inRate, inBurst, outRate, outBurst)
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ing := startIngress(t, path)

	body, _ := json.Marshal(map[string]any{
		"model":      "claude",
		"max_tokens": maxTokens,
		"messages":   []map[string]string{{"role": "user", "content": strings.Repeat("The quick brown fox. ", 55)}},
	})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	t.Cleanup(client.CloseIdleConnections)
	const clients, run = 6, 3 * time.Second
	start := time.Now()
	stop := start.Add(run)
	var mu sync.Mutex
	codes := map[int]int{}
	bindings := map[string]int{} // the policy each ingress 429 named
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				req, _ := http.NewRequest("POST", ing.url+"/v1/messages", strings.NewReader(string(body)))
				req.Header.Set("X-Api-Key", "k")
				res, err := client.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				mu.Lock()
				codes[res.StatusCode]++
				if res.StatusCode == http.StatusTooManyRequests && res.Header.Get("RateLimit-Policy") != "" {
					name, _, _ := strings.Cut(res.Header.Get("RateLimit-Policy"), ";")
					bindings[name]++
				}
				mu.Unlock()
				if res.StatusCode == http.StatusTooManyRequests {
					time.Sleep(5 * time.Millisecond) // a client that keeps knocking
				}
			}
		}()
	}
	wg.Wait()
	end := time.Now()
	// Measure after the first half second: the buckets start full.
	from := start.Add(500 * time.Millisecond)
	in, out, n, refused := up.served(from, end)
	secs := end.Sub(from).Seconds()
	outUse := float64(out) / (outRate * secs)
	inUse := float64(in) / (inRate * secs)
	share := float64(refused) / float64(n+refused)
	t.Logf("ingress answers %v; 429s named %v; upstream served %d and refused %d (%.2f%%); over %.2fs: output %d tokens, %.1f%% of the output budget (%.1f%% of the upstream's), input %d counted, %.1f%% of the input budget",
		codes, bindings, n, refused, 100*share, secs, out, 100*outUse, 100*float64(out)/(upOut*secs), in, 100*inUse)
	if share > 0.01 {
		t.Errorf("the upstream answered %.2f%% of its requests 429 (%d of %d); want at most 1%%", 100*share, refused, n+refused)
	}
	if outUse < 0.85 {
		t.Errorf("output, the binding budget, was %.1f%% used; want at least 85%%", 100*outUse)
	}
	if bindings[`"llm/output"`] == 0 {
		t.Errorf("no 429 named the binding budget llm/output: %v", bindings)
	}
}
