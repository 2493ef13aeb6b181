package ingress

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/limit"
)

// streamUpstream is a recording LLM-like upstream that streams its answers: OpenAI's chat
// completions (/v1/chat/completions, server-sent chunks and, last, the usage chunk that
// stream_options.include_usage asks for) or Anthropic's Messages (/v1/messages, message_start
// with the input tokens, message_delta with the output tokens). Its prompt tokens are one per
// 3 bytes of the messages; its completion tokens 30% to 100% of max_tokens, in turn. It sends
// `deltas` delta events a request, each flushed. When hold is set, it sends the deltas, then
// waits for release (or the request to end) before the usage; with cut set, it never sends
// the usage and waits for the request to end.
type streamUpstream struct {
	deltas  int
	hold    bool
	cut     atomic.Bool
	release chan struct{}
	n       atomic.Int64
	mu      sync.Mutex
	truth   int64 // the usage of the answers that sent it
}

func (u *streamUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Messages  json.RawMessage `json:"messages"`
		MaxTokens int64           `json:"max_tokens"`
	}
	b, err := io.ReadAll(r.Body) // all of it: the request is over before the answer starts
	if err == nil {
		err = json.Unmarshal(b, &req)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	prompt := (int64(len(req.Messages)) + 2) / 3
	i := u.n.Add(1)
	completion := req.MaxTokens * (30 + (i*37)%71) / 100 // 30% to 100%
	anthropic := strings.HasPrefix(r.URL.Path, "/v1/messages")
	w.Header().Set("Content-Type", "text/event-stream")
	fl := http.NewResponseController(w)
	send := func(event, data string) {
		if event != "" {
			fmt.Fprintf(w, "event: %s\n", event)
		}
		fmt.Fprintf(w, "data: %s\n\n", data)
		fl.Flush()
	}
	if anthropic {
		send("message_start", fmt.Sprintf(`{"type":"message_start","message":{"id":"m","usage":{"input_tokens":%d,"output_tokens":1}}}`, prompt))
	}
	for range u.deltas {
		if anthropic {
			send("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"tok tok"}}`)
		} else {
			send("", `{"id":"c","choices":[{"index":0,"delta":{"content":"tok"}}],"usage":null}`)
		}
	}
	switch {
	case u.cut.Load():
		<-r.Context().Done()
		return
	case u.hold:
		select {
		case <-u.release:
		case <-r.Context().Done():
			return
		}
	}
	u.mu.Lock()
	u.truth += prompt + completion
	u.mu.Unlock()
	if anthropic {
		send("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":%d}}`, completion))
		send("message_stop", `{"type":"message_stop"}`)
		return
	}
	send("", fmt.Sprintf(`{"id":"c","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
		prompt, completion, prompt+completion))
	send("", "[DONE]")
}

// streamYAML has two rules: OpenAI's (streamed usage in json:/usage/total_tokens) and
// Anthropic's (input plus output tokens), each a day's fixed window so that the key's
// remaining units are exact, and cost_on_cut as given.
func streamYAML(onCut string) string {
	return fmt.Sprintf(`
store_timeout: 2s
rules:
  - name: openai
    match: {path: /v1/chat/completions}
    key: [header:Authorization]
    algorithm: fixed_window
    limit: 1000000
    period: 24h
    cost: max(json:/max_tokens, 16) + prompt_tokens(json:/messages)
    cost_from_response: json:/usage/total_tokens
    cost_on_cut: %[1]s
  - name: anthropic
    match: {path: /v1/messages}
    key: [header:Authorization]
    algorithm: fixed_window
    limit: 1000000
    period: 24h
    cost: max(json:/max_tokens, 16) + prompt_tokens(json:/messages)
    cost_from_response: json:/usage/input_tokens + json:/usage/output_tokens
    cost_on_cut: %[1]s
`, onCut)
}

type streamRig struct {
	up  *streamUpstream
	reg *prometheus.Registry
	url string
}

func newStreamRig(t *testing.T, up *streamUpstream, yaml string) *streamRig {
	t.Helper()
	us := httptest.NewServer(up)
	t.Cleanup(us.Close)
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
	return &streamRig{up: up, reg: reg, url: ing.URL}
}

// chatBody is a streamed request with max_tokens and a prompt of n bytes; charge is what the
// rules above charge it.
func chatBody(maxTokens, n int) (body []byte, charge int64) {
	body, _ = json.Marshal(map[string]any{
		"model": "m", "stream": true, "stream_options": map[string]bool{"include_usage": true},
		"max_tokens": maxTokens,
		"messages":   []map[string]string{{"role": "user", "content": strings.Repeat("a", n)}},
	})
	messages := int64(len(`[{"content":"","role":"user"}]`) + n)
	return body, max(int64(maxTokens), 16) + (messages+1)/2
}

func (rg *streamRig) open(t *testing.T, path string, body []byte) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", rg.url+path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer k")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		t.Fatalf("%s: status %d: %s", path, res.StatusCode, b)
	}
	return res
}

// waitMetric waits, up to 10 s, for a metric of the rig to reach want.
func (rg *streamRig) waitMetric(t *testing.T, want float64, name string, labels ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for metric(t, rg.reg, name, labels...) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s%v = %v, want %v", name, labels, metric(t, rg.reg, name, labels...), want)
		}
		time.Sleep(time.Millisecond) // polling a condition
	}
}

// remaining is the units the key has left under the rule at path, as a probe request's
// X-RateLimit-Remaining says, plus the probe's own charge.
func (rg *streamRig) remaining(t *testing.T, path string) int64 {
	t.Helper()
	body, charge := chatBody(100, 300)
	res := rg.open(t, path, body)
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	n, err := strconv.ParseInt(res.Header.Get("X-RateLimit-Remaining"), 10, 64)
	if err != nil {
		t.Fatalf("X-RateLimit-Remaining %q", res.Header.Get("X-RateLimit-Remaining"))
	}
	return n + charge
}

// Streamed OpenAI-style (include_usage) and Anthropic-style answers, true usage 30% to 100%
// of max_tokens: once they end, each key has been charged exactly the usage the upstream
// streamed, no more (the entry charge is refunded down to it), no less.
func TestStreamReconciled(t *testing.T) {
	up := &streamUpstream{deltas: 5}
	rg := newStreamRig(t, up, streamYAML("estimate"))
	for _, path := range []string{"/v1/chat/completions", "/v1/messages"} {
		rule := map[string]string{"/v1/chat/completions": "openai", "/v1/messages": "anthropic"}[path]
		up.mu.Lock()
		up.truth = 0
		up.mu.Unlock()
		var charged int64
		const n = 12
		for i := range n {
			body, charge := chatBody(200+100*i, 2000+500*i)
			charged += charge
			res := rg.open(t, path, body)
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if !bytes.Contains(b, []byte("usage")) {
				t.Fatalf("%s: the answer lost its usage event: %q", path, b)
			}
		}
		up.mu.Lock()
		truth := up.truth
		up.mu.Unlock()
		rg.waitMetric(t, float64(charged-truth), "sluice_rule_units_reconciled_total", "rule", rule, "direction", "refund")
		if cut := metric(t, rg.reg, "sluice_rule_streams_cut_total", "rule", rule, "charged", "estimate"); cut != 0 {
			t.Errorf("%s: %v streams counted cut short, want none", path, cut)
		}
		used := 1000000 - rg.remaining(t, path)
		if used != truth {
			t.Errorf("%s: the key was charged %d units for %d streamed answers whose usage was %d (entry charges %d)", path, used, n, truth, charged)
		}
		t.Logf("%s: %d streamed answers, entry charges %d, true usage %d, key charged %d", path, n, charged, truth, used)
	}
}

// A streamed answer is passed on as it flows: the client reads the first event while the
// upstream has not sent its last.
func TestStreamNotBuffered(t *testing.T) {
	up := &streamUpstream{deltas: 1, hold: true, release: make(chan struct{})}
	rg := newStreamRig(t, up, streamYAML("estimate"))
	body, _ := chatBody(100, 300)
	res := rg.open(t, "/v1/chat/completions", body)
	defer res.Body.Close()
	first := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(res.Body).ReadString('\n')
		first <- line
	}()
	select {
	case line := <-first:
		if !strings.Contains(line, `"delta"`) {
			t.Fatalf("first line %q, want the first delta", line)
		}
	case <-time.After(10 * time.Second):
		close(up.release)
		t.Fatal("the client did not see the first event while the upstream held the last: the stream is buffered")
	}
	close(up.release)
	io.Copy(io.Discard, res.Body)
}

// A client that hangs up mid-stream leaves its entry charge standing (cost_on_cut: estimate),
// or is charged what the events it was passed said (cost_on_cut: deltas).
func TestStreamCut(t *testing.T) {
	for _, onCut := range []string{"estimate", "deltas"} {
		t.Run(onCut, func(t *testing.T) {
			const deltas = 4
			up := &streamUpstream{deltas: deltas}
			up.cut.Store(true)
			rg := newStreamRig(t, up, streamYAML(onCut))
			for _, path := range []string{"/v1/chat/completions", "/v1/messages"} {
				rule := map[string]string{"/v1/chat/completions": "openai", "/v1/messages": "anthropic"}[path]
				body, charge := chatBody(1000, 3000)
				res := rg.open(t, path, body)
				r := bufio.NewReader(res.Body)
				events := deltas
				if rule == "anthropic" {
					events++ // message_start
				}
				for seen := 0; seen < events; {
					line, err := r.ReadString('\n')
					if err != nil {
						t.Fatal(err)
					}
					if strings.HasPrefix(line, "data:") {
						seen++
					}
				}
				res.Body.Close() // hang up mid-stream
				rg.waitMetric(t, 1, "sluice_rule_streams_cut_total", "rule", rule, "charged", onCut)
				want := charge
				if onCut == "deltas" {
					want = deltas // one a delta
					if rule == "anthropic" {
						want += (int64(len(`[{"content":"","role":"user"}]`)+3000)+2)/3 + 1 // message_start's input and output tokens
					}
					rg.waitMetric(t, float64(charge-want), "sluice_rule_units_reconciled_total", "rule", rule, "direction", "refund")
				}
				up.cut.Store(false) // the probe's answer finishes
				if used := 1000000 - rg.remaining(t, path); used != want {
					t.Errorf("%s, cost_on_cut %s: a stream cut short was charged %d, want %d (entry charge %d)", path, onCut, used, want, charge)
				}
				up.cut.Store(true)
			}
		})
	}
}

// A stream whose events go more than cut_on_debt units above its charge is ended cleanly: the
// client's answer ends without error after the last whole event passed on, the upstream is
// let go, and the key is charged what the events passed on said (one unit a delta).
func TestStreamCutOnDebt(t *testing.T) {
	const deltas, maxTokens, bound = 50, 10, 5
	up := &streamUpstream{deltas: deltas}
	up.cut.Store(true) // it never sends its usage: only the cut ends the stream
	rg := newStreamRig(t, up, `
store_timeout: 2s
rules:
  - name: openai
    match: {path: /v1/chat/completions}
    key: [header:Authorization]
    algorithm: fixed_window
    limit: 1000000
    period: 24h
    cost: json:/max_tokens
    cost_from_response: json:/usage/total_tokens
    cut_on_debt: 5
`)
	body, _ := chatBody(maxTokens, 100)
	res := rg.open(t, "/v1/chat/completions", body)
	done := make(chan struct{})
	var (
		b   []byte
		err error
	)
	go func() {
		defer close(done)
		b, err = io.ReadAll(res.Body)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		res.Body.Close()
		t.Fatal("the stream was not ended 5 units above its charge")
	}
	res.Body.Close()
	if err != nil {
		t.Fatalf("the stream did not end cleanly: %v", err)
	}
	passed := int64(bytes.Count(b, []byte(`"delta"`)))
	if passed <= maxTokens+bound || passed > deltas {
		t.Errorf("%d deltas passed on; want more than %d (charge %d + cut_on_debt %d) and fewer than the %d sent", passed, maxTokens+bound, maxTokens, bound, deltas)
	}
	rg.waitMetric(t, 1, "sluice_rule_streams_cut_total", "rule", "openai", "charged", "debt")
	rg.waitMetric(t, float64(passed-maxTokens), "sluice_rule_units_reconciled_total", "rule", "openai", "direction", "charge")
	up.cut.Store(false)
	body, _ = chatBody(100, 300) // charged its max_tokens, 100
	probe := rg.open(t, "/v1/chat/completions", body)
	io.Copy(io.Discard, probe.Body)
	probe.Body.Close()
	if left, _ := strconv.ParseInt(probe.Header.Get("X-RateLimit-Remaining"), 10, 64); 1000000-left-100 != passed {
		t.Errorf("the key was charged %d for a stream cut on debt after %d deltas", 1000000-left-100, passed)
	}
	t.Logf("cut on debt after %d deltas (charge %d, cut_on_debt %d)", passed, maxTokens, bound)
}
