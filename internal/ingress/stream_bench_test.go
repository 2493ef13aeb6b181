package ingress

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// BenchmarkStreamPassThrough is a streamed chat completion (256 OpenAI-style chunks of about
// 110 bytes, each flushed, then the include_usage chunk and [DONE]) read by a client over
// loopback TCP: straight from the upstream (direct), through the ingress under a rule that does
// not reconcile (passthrough), and through it under a rule with an entry charge and
// cost_from_response, so that the ingress reads every event for its usage and reconciles
// when the stream ends (reconciled). ttfb-µs is the mean time from sending the request to
// reading the first event; MB/s and ns/op are for the whole answer.
func BenchmarkStreamPassThrough(b *testing.B) {
	const events = 256
	chunk := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"token"}}],"usage":null}` + "\n\n")
	usage := []byte(`data: {"id":"chatcmpl-1","choices":[],"usage":{"prompt_tokens":40,"completion_tokens":256,"total_tokens":296}}` + "\n\ndata: [DONE]\n\n")
	size := int64(events*len(chunk) + len(usage))
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fl := http.NewResponseController(w)
		for range events {
			w.Write(chunk)
			fl.Flush()
		}
		w.Write(usage)
	}))
	b.Cleanup(up.Close)
	rule := `
rules:
  - name: tokens
    match: {path: /v1/chat/completions}
    key: [header:Authorization]
    algorithm: fixed_window
    limit: 1000000000000
    period: 24h
`
	body := []byte(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":512,"messages":[{"role":"user","content":"hello there"}]}`)
	for _, tc := range []struct{ name, yaml string }{
		{"direct", ""},
		{"passthrough", rule},
		{"reconciled", rule + `    cost: max(json:/max_completion_tokens, json:/max_tokens, 4096) + prompt_tokens(json:/messages)
    cost_from_response: json:/usage/total_tokens
`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			url := up.URL
			if tc.yaml != "" {
				ing := httptest.NewServer(benchServer(b, up.URL, tc.yaml))
				b.Cleanup(ing.Close)
				url = ing.URL
			}
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
			b.Cleanup(client.CloseIdleConnections)
			buf := make([]byte, 64<<10)
			var ttfb time.Duration
			b.SetBytes(size)
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest("POST", url+"/v1/chat/completions", bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer k")
				start := time.Now()
				res, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				n, err := res.Body.Read(buf)
				if n == 0 {
					b.Fatalf("first read: %v", err)
				}
				ttfb += time.Since(start)
				m, _ := io.CopyBuffer(io.Discard, res.Body, buf)
				res.Body.Close()
				if int64(n)+m != size {
					b.Fatalf("read %d bytes, want %d", int64(n)+m, size)
				}
			}
			b.ReportMetric(float64(ttfb.Microseconds())/float64(b.N), "ttfb-µs")
		})
	}
}
