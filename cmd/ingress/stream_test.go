package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// streamingLLM is an LLM-like upstream that streams its answers, OpenAI's chat completions
// (server-sent chunks and, last, the usage chunk that stream_options.include_usage asks for)
// or, with anthropic set, Anthropic's Messages (message_start with the input tokens,
// message_delta with the output tokens). Its prompt tokens are one per 3 bytes of the
// messages; its completion tokens 30% to 100% of the larger of max_completion_tokens and
// max_tokens. It enforces a token budget of its own as a token bucket (capacity limit,
// refilled limit per period, continuously, as OpenAI describes its limits), counting each
// request's true usage when it arrives: a request the bucket cannot pay is answered 429 with
// x-ratelimit-*-tokens headers and Retry-After. A stream sends `deltas` deltas, `gap` apart
// (the generation's pace). The key "Bearer cut" gets its deltas and never its usage: its
// stream stays open until the client hangs up.
type streamingLLM struct {
	url       string
	anthropic bool
	limit     int64
	period    time.Duration
	deltas    int
	gap       time.Duration

	mu      sync.Mutex
	rng     *rand.Rand
	level   float64
	last    time.Time
	log     []streamed // served, in order of arrival
	refused int
}

type streamed struct {
	at            time.Time
	charge, truth int64 // the ingress rule's entry charge, as the test expects it; the usage
}

// The paces of the figure's streams (8 deltas a stream): at 30 to 1, a 10 ms gap makes a
// stream of 2.4 s, short against the minute; a 160 ms gap one of 38 s.
const (
	shortGap = 10 * time.Millisecond
	longGap  = 160 * time.Millisecond
)

func newStreamingLLM(t *testing.T, anthropic bool, limit int64, period, gap time.Duration) *streamingLLM {
	u := &streamingLLM{anthropic: anthropic, limit: limit, period: period, deltas: 8, gap: gap,
		rng: rand.New(rand.NewPCG(40, 2)), level: float64(limit), last: time.Now()}
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

func (u *streamingLLM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		MaxCompletion int64           `json:"max_completion_tokens"`
		MaxTokens     int64           `json:"max_tokens"`
		Messages      json.RawMessage `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	bound := max(req.MaxCompletion, req.MaxTokens)
	prompt := (int64(len(req.Messages)) + 2) / 3
	cut := r.Header.Get("Authorization") == "Bearer cut"
	now := time.Now()
	u.mu.Lock()
	completion := bound * (30 + u.rng.Int64N(71)) / 100
	u.level = min(float64(u.limit), u.level+float64(u.limit)*now.Sub(u.last).Seconds()/u.period.Seconds())
	u.last = now
	if float64(prompt+completion) > u.level {
		u.refused++
		remaining := int64(u.level)
		u.mu.Unlock()
		wait := time.Duration(float64(prompt+completion-remaining) / float64(u.limit) * float64(u.period))
		w.Header().Set("x-ratelimit-limit-tokens", strconv.FormatInt(u.limit, 10))
		w.Header().Set("x-ratelimit-remaining-tokens", strconv.FormatInt(remaining, 10))
		w.Header().Set("x-ratelimit-reset-tokens", wait.String())
		w.Header().Set("Retry-After", strconv.FormatInt(int64(wait/time.Second)+1, 10))
		http.Error(w, `{"error":{"type":"tokens","code":"rate_limit_exceeded"}}`, http.StatusTooManyRequests)
		return
	}
	u.level -= float64(prompt + completion)
	if !cut {
		u.log = append(u.log, streamed{now, max(bound, 4096) + (int64(len(req.Messages))+1)/2, prompt + completion})
	}
	u.mu.Unlock()
	u.stream(w, r, prompt, completion, cut)
}

func (u *streamingLLM) stream(w http.ResponseWriter, r *http.Request, prompt, completion int64, cut bool) {
	w.Header().Set("Content-Type", "text/event-stream")
	fl := http.NewResponseController(w)
	send := func(event, data string) {
		if event != "" {
			fmt.Fprintf(w, "event: %s\n", event)
		}
		fmt.Fprintf(w, "data: %s\n\n", data)
		fl.Flush()
	}
	if u.anthropic {
		send("message_start", fmt.Sprintf(`{"type":"message_start","message":{"id":"m","usage":{"input_tokens":%d,"output_tokens":1}}}`, prompt))
	}
	pace := time.NewTimer(0)
	defer pace.Stop()
	for range u.deltas {
		select {
		case <-pace.C: // the generation's pace, not a synchronisation
		case <-r.Context().Done():
			return
		}
		pace.Reset(u.gap)
		if u.anthropic {
			send("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"tok tok"}}`)
		} else {
			send("", `{"id":"c","choices":[{"index":0,"delta":{"content":"tok"}}],"usage":null}`)
		}
	}
	if cut {
		<-r.Context().Done()
		return
	}
	if u.anthropic {
		send("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":%d}}`, completion))
		send("message_stop", `{"type":"message_stop"}`)
		return
	}
	send("", fmt.Sprintf(`{"id":"c","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
		prompt, completion, prompt+completion))
	send("", "[DONE]")
}

// room returns the tokens the upstream's budget holds now.
func (u *streamingLLM) room() float64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return min(float64(u.limit), u.level+float64(u.limit)*time.Since(u.last).Seconds()/u.period.Seconds())
}

// servedIn returns the tokens served from..to; and the requests served, their entry charges
// and usage, and the requests refused, in all.
func (u *streamingLLM) servedIn(from, to time.Time) (tokens int64, n int, charges, truth int64, refused int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, s := range u.log {
		if !s.at.Before(from) && s.at.Before(to) {
			tokens += s.truth
		}
		charges += s.charge
		truth += s.truth
	}
	return tokens, len(u.log), charges, truth, u.refused
}

// chatRequest is a streamed chat completion of a prompt of n bytes with a completion bound of
// maxTokens, sent as max_completion_tokens when modern is set (OpenAI's current name), as
// max_tokens otherwise; and its entry charge under the rule of TestStreamedBudgetFigure.
func chatRequest(anthropic, modern bool, maxTokens, n int) (body []byte, charge int64) {
	messages, _ := json.Marshal([]map[string]string{{"role": "user", "content": strings.Repeat("lorem ipsum ", n/12)}})
	req := map[string]any{"model": "m", "stream": true, "messages": json.RawMessage(messages)}
	if !anthropic {
		req["stream_options"] = map[string]bool{"include_usage": true}
	}
	if modern && !anthropic {
		req["max_completion_tokens"] = maxTokens
	} else {
		req["max_tokens"] = maxTokens
	}
	body, _ = json.Marshal(req)
	return body, int64(max(maxTokens, 4096)) + (int64(len(messages))+1)/2
}

// TestStreamedBudgetFigure is issue 40's figure for streamed chat completions, OpenAI-style
// (include_usage) and Anthropic-style, scaled in time 30 to 1: a minute is 2 s, so the budget
// of 20 000 tokens a minute is 20 000 tokens per 2 s. An ingress process runs
// examples/llm.yaml's own tokens-per-key rule, read from the file (its algorithm, limit,
// burst, entry charge, cost_from_response and cost_on_cut; its period scaled; Anthropic's
// usage pointers for the Anthropic style, as the example's comments say). It is in front of an
// upstream that streams its answers, each 8 deltas 10 ms apart (80 ms, about 2.4 s of a real
// minute: short streams) or 160 ms apart (1.28 s, 38 s of a real minute: long streams), with
// a true usage of a token per 3 bytes of prompt plus 30% to 100% of the completion bound
// (1 024 to 4 096), and that enforces the same budget itself, as a token bucket of capacity
// one minute's tokens. Eight clients of one key (sixteen with long streams, which hold a
// client 16 times longer: the budget needs about 5 long streams in flight, and each client
// also sits out whole-second Retry-Afters) send as fast as they are admitted for 12 s (six
// windows; 16 s, eight windows, with long streams), waiting out each Retry-After (whole
// seconds: half a scaled window). Counted at the upstream: from the
// end of the first window on, it serves at least 90% of its budget, and it answers at most 1%
// of its requests 429. Every finished stream is reconciled to its usage (the refunds counted
// are the entry charges less the usage, to the token). Then a client of another key hangs up
// mid-stream: it was charged its entry charge on entry (X-RateLimit-Remaining), the stream is
// counted cut, and nothing is refunded for it (cost_on_cut: estimate).
//
// The rule's algorithm matters: a window (sliding_window, fixed_window) admits a request only
// while the window's count plus its entry charge fits, and the room below one entry charge is
// lost as the window moves, about the entry charge less the usage each period; a token bucket
// keeps it, and its exact refund (limit/peaks.go) gives back what a long stream did not use.
// See docs/llm.md, "Streamed answers", "Measured".
func TestStreamedBudgetFigure(t *testing.T) {
	for _, style := range []string{"openai", "anthropic"} {
		for _, streams := range []string{"short", "long"} {
			t.Run(style+"/"+streams, func(t *testing.T) {
				t.Parallel()
				gap := shortGap
				if streams == "long" {
					gap = longGap
				}
				streamedBudget(t, style == "anthropic", gap)
			})
		}
	}
}

// figureTimeScale is how many times faster than real time the figure runs.
const figureTimeScale = 30

// exampleTokensRule returns the YAML of examples/llm.yaml's tokens-per-key rule for the
// figure: its algorithm, limit, burst, cost, cost_fallback, cost_from_response (Anthropic's
// usage for anthropic) and cost_on_cut, its period divided by figureTimeScale; and that limit
// and period.
func exampleTokensRule(t *testing.T, anthropic bool) (yml string, limit int64, period time.Duration) {
	t.Helper()
	b, err := os.ReadFile("../../examples/llm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ex struct {
		Rules []map[string]any `yaml:"rules"`
	}
	if err := yaml.Unmarshal(b, &ex); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(ex.Rules, func(r map[string]any) bool { return r["name"] == "tokens-per-key" })
	if i < 0 {
		t.Fatal("examples/llm.yaml has no rule tokens-per-key")
	}
	r := ex.Rules[i]
	if anthropic {
		r["cost_from_response"] = "json:/usage/input_tokens + json:/usage/output_tokens"
	}
	real, err := time.ParseDuration(fmt.Sprint(r["period"]))
	if err != nil {
		t.Fatalf("examples/llm.yaml: tokens-per-key: period: %v", err)
	}
	period = real / figureTimeScale
	limit, _ = r["limit"].(int64)
	if n, ok := r["limit"].(int); ok {
		limit = int64(n)
	}
	yml = fmt.Sprintf("    period: %s\n", period)
	for _, k := range []string{"algorithm", "limit", "burst", "cost", "cost_fallback", "cost_from_response", "cost_on_cut"} {
		if v, ok := r[k]; ok {
			yml += fmt.Sprintf("    %s: %q\n", k, fmt.Sprint(v))
		}
	}
	return yml, limit, period
}

func streamedBudget(t *testing.T, anthropic bool, gap time.Duration) {
	rs := testenv.Redis(t)
	ns := testenv.NATS(t)
	rule, limit, period := exampleTokensRule(t, anthropic)
	up := newStreamingLLM(t, anthropic, limit, period, gap)
	path := "/v1/chat/completions"
	if anthropic {
		path = "/v1/messages"
	}
	cfgPath := filepath.Join(t.TempDir(), "sluice.yaml")
	cfg := fmt.Sprintf(`upstream: %s
redis: { url: %q }
nats: { url: %q }
store_timeout: 1s
rules:
  - name: tokens
    match: { methods: [POST], path: %s }
    key: [header:Authorization]
%s`, up.url, rs.URL(), ns.URL, path, rule)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ing := startIngress(t, cfgPath)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	t.Cleanup(client.CloseIdleConnections)
	post := func(key string, body []byte) *http.Response {
		req, _ := http.NewRequest("POST", ing.url+path, strings.NewReader(string(body)))
		req.Header.Set("Authorization", key)
		res, err := client.Do(req)
		if err != nil {
			t.Error(err)
			return nil
		}
		return res
	}

	clients := 8
	if gap == longGap {
		clients = 16
	}
	run := 6 * period
	if gap == longGap {
		// While the first long streams run, the bucket funds the entry charges of more and more
		// streams in flight (each about twice its usage) before their refunds come back: the
		// second window is used less, and eight windows weigh that ramp as a minute of a longer
		// run would, rather than a fifth of the figure.
		run = 8 * period
	}
	start := time.Now()
	stop := start.Add(run)
	var mu sync.Mutex
	codes := map[string]int{}
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 40))
			for time.Now().Before(stop) {
				body, _ := chatRequest(anthropic, rng.IntN(2) == 0, 1024+rng.IntN(3073), 1000+rng.IntN(3001))
				res := post("Bearer load", body)
				if res == nil {
					return
				}
				b, _ := io.ReadAll(res.Body)
				res.Body.Close()
				from := "ingress"
				if res.Header.Get("x-ratelimit-limit-tokens") != "" {
					from = "upstream"
				}
				mu.Lock()
				codes[fmt.Sprintf("%d from %s", res.StatusCode, from)]++
				mu.Unlock()
				switch res.StatusCode {
				case http.StatusOK:
					if !strings.Contains(string(b), `"output_tokens"`) && !strings.Contains(string(b), `"total_tokens"`) {
						t.Errorf("a stream lost its usage event: %q", b)
					}
				case http.StatusTooManyRequests:
					secs, err := strconv.Atoi(res.Header.Get("Retry-After"))
					if err != nil {
						t.Errorf("429 without a Retry-After: %q", res.Header.Get("Retry-After"))
						return
					}
					wait := time.NewTimer(min(time.Duration(secs)*time.Second, time.Until(stop)))
					<-wait.C // the Retry-After, waited out as a client does
				default:
					t.Errorf("status %d: %s", res.StatusCode, b)
					return
				}
			}
		}()
	}
	wg.Wait()
	tokens, n, charges, truth, refused := up.servedIn(start.Add(period), stop)
	span := stop.Sub(start.Add(period))
	use := float64(tokens) / (float64(limit) * span.Seconds() / period.Seconds())
	share := float64(refused) / float64(n+refused)
	windows := make([]string, 0, run/period)
	for k := range run / period {
		w, _, _, _, _ := up.servedIn(start.Add(k*period), start.Add((k+1)*period))
		windows = append(windows, fmt.Sprintf("%.0f%%", 100*float64(w)/float64(limit)))
	}
	t.Logf("%s, streams of %v: answers %v; the upstream served %d streams and refused %d (%.2f%%); after the first %v it served %d tokens in %.2fs, %.1f%% of its budget (window by window %v); entry charges %d, true usage %d",
		path, time.Duration(up.deltas)*gap, codes, n, refused, 100*share, period, tokens, span.Seconds(), 100*use, windows, charges, truth)
	if share > 0.01 {
		t.Errorf("the upstream answered %.2f%% of its requests 429 (%d of %d); want at most 1%%", 100*share, refused, n+refused)
	}
	if use < 0.9 {
		t.Errorf("%.1f%% of the budget used after the first %v; want at least 90%%", 100*use, period)
	}
	// Every finished stream is reconciled: the refunds are the entry charges less the usage.
	refund := `sluice_rule_units_reconciled_total{direction="refund",rule="tokens"}`
	testenv.WaitFor(t, 10*time.Second, "every stream's refund", func() bool {
		v, _ := metricValue(ing.metrics(), refund)
		return v == float64(charges-truth)
	})

	// A client hangs up mid-stream: its entry charge stands. It is a key of its own at the
	// ingress, but the upstream's budget is the account's, which the load may have left
	// empty: it waits until the upstream can serve the stream.
	body, charge := chatRequest(anthropic, true, 2000, 3000)
	testenv.WaitFor(t, 10*time.Second, "the upstream's budget to hold the cut stream", func() bool {
		return up.room() >= float64(charge)
	})
	res := post("Bearer cut", body)
	if res == nil {
		return
	}
	if res.StatusCode != http.StatusOK {
		t.Fatalf("the cut stream: status %d", res.StatusCode)
	}
	if got := res.Header.Get("X-RateLimit-Remaining"); got != strconv.FormatInt(limit-charge, 10) {
		t.Errorf("the cut stream's X-RateLimit-Remaining %s, want %d: charged %d on entry", got, limit-charge, charge)
	}
	r := bufio.NewReader(res.Body)
	for seen := 0; seen < 3; {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "data:") {
			seen++
		}
	}
	res.Body.Close() // hang up mid-stream
	testenv.WaitFor(t, 10*time.Second, "the cut stream to be counted", func() bool {
		v, _ := metricValue(ing.metrics(), `sluice_rule_streams_cut_total{charged="estimate",rule="tokens"}`)
		return v == 1
	})
	text := ing.metrics()
	if v, _ := metricValue(text, refund); v != float64(charges-truth) {
		t.Errorf("refunds %v after the cut stream, want %d: the cut stream was refunded %v of its entry charge %d", v, charges-truth, v-float64(charges-truth), charge)
	}
	if v, _ := metricValue(text, `sluice_rule_units_reconciled_total{direction="charge",rule="tokens"}`); v != 0 {
		t.Errorf("%v units charged above entry charges that bound the usage, want 0", v)
	}
	// An upstream 429 carries no usage: its entry charge stands. Nothing else goes unreconciled.
	if v, _ := metricValue(text, `sluice_rule_cost_unreconciled_total{rule="tokens"}`); v != float64(refused) {
		t.Errorf("%v answers unreconciled, want %d (the upstream's 429s)", v, refused)
	}
}

// metrics returns the ingress's /metrics text ("" while it cannot be read).
func (p *ingressProc) metrics() string {
	res, err := http.Get("http://" + p.admin + "/metrics")
	if err != nil {
		return ""
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

// metricValue returns the value of the sample whose line starts with series (name and labels
// as exposed) in text, and whether there is one.
func metricValue(text, series string) (float64, bool) {
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			if v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); err == nil {
				return v, true
			}
		}
	}
	return 0, false
}
