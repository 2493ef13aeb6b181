package cost

import (
	"net/http"
	"testing"

	"github.com/sluice-rl/sluice/internal/config"
)

const openAIStream = "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"Hel\"}}],\"usage\":null}\n\n" +
	"data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"lo\"}}],\"usage\":null}\n\n" +
	": keep-alive\n\n" +
	"data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":37,\"total_tokens\":157}}\n\n" +
	"data: [DONE]\n\n"

const anthropicStream = "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":250,\"output_tokens\":1}}}\r\n\r\n" +
	"event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\r\n\r\n" +
	"event: message_delta\r\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":61}}\r\n\r\n" +
	"event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n"

func mustCost(t *testing.T, s string) config.Cost {
	t.Helper()
	c, err := config.ParseCost(s, true)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The final usage is read from OpenAI's include_usage chunk and from Anthropic's message_start
// and message_delta, whatever the boundaries the bytes arrive in; the events seen before it
// are counted as deltas.
func TestStreamUsage(t *testing.T) {
	for _, tc := range []struct {
		name, stream, cost string
		sse                bool
		want, deltas       int64
	}{
		{"openai", openAIStream, "json:/usage/total_tokens", true, 157, 2},
		{"openai parts", openAIStream, "json:/usage/prompt_tokens + json:/usage/completion_tokens", true, 157, 2},
		{"anthropic", anthropicStream, "json:/usage/input_tokens + json:/usage/output_tokens", true, 311, 2},
		{"ndjson", "{\"done\":false}\n{\"done\":true,\"prompt_eval_count\":26,\"eval_count\":290}", "json:/prompt_eval_count + json:/eval_count", false, 316, 1},
	} {
		for _, step := range []int{1, 3, 7, 64, 1 << 20} {
			c := mustCost(t, tc.cost)
			s := NewStream(tc.sse, c)
			for b := []byte(tc.stream); len(b) > 0; {
				n := min(step, len(b))
				s.Write(b[:n])
				b = b[n:]
			}
			s.End()
			got, ok := s.Cost(c, http.Header{})
			if !ok || got != tc.want {
				t.Errorf("%s in writes of %d: cost %d, %v; want %d", tc.name, step, got, ok, tc.want)
			}
			if _, d := s.Events(); d != tc.deltas {
				t.Errorf("%s in writes of %d: %d deltas, want %d", tc.name, step, d, tc.deltas)
			}
		}
	}
}

// A stream cut before its usage cannot be read (a sum misses its operands); Seen counts what
// the events said (Anthropic's input tokens) plus one per delta.
func TestStreamCut(t *testing.T) {
	c := mustCost(t, "json:/usage/input_tokens + json:/usage/output_tokens")
	s := NewStream(true, c)
	cut := anthropicStream[:len(anthropicStream)-200] // before message_delta's usage
	s.Write([]byte(cut))
	s.End()
	if n, ok := s.Cost(c, nil); ok && n == 311 {
		t.Fatalf("a stream cut before its final usage read as finished: %d", n)
	}
	if got := s.Seen(c, nil); got != 250+1+1 {
		t.Errorf("Seen = %d, want 252 (input 250, output 1 from message_start, one delta)", got)
	}
	o := mustCost(t, "json:/usage/total_tokens")
	s = NewStream(true, o)
	s.Write([]byte(openAIStream[:150]))
	s.End()
	if _, ok := s.Cost(o, nil); ok {
		t.Error("an OpenAI stream cut before its usage chunk has a cost")
	}
	if got := s.Seen(o, nil); got != 2 {
		t.Errorf("Seen = %d, want 2 deltas", got)
	}
}

// A line longer than MaxReadAhead is skipped; the events after it are read.
func TestStreamLongLine(t *testing.T) {
	c := mustCost(t, "json:/usage/total_tokens")
	s := NewStream(false, c)
	long := make([]byte, config.MaxReadAhead+10)
	for i := range long {
		long[i] = 'x'
	}
	s.Write([]byte(`{"usage":{"total_tokens":9`))
	s.Write(long)
	s.Write([]byte("}}\n{\"usage\":{\"total_tokens\":42}}\n"))
	s.End()
	if n, ok := s.Cost(c, nil); !ok || n != 42 {
		t.Errorf("cost %d, %v; want 42", n, ok)
	}
}

func TestIsStream(t *testing.T) {
	for ct, want := range map[string][2]bool{
		"text/event-stream; charset=utf-8": {true, true},
		"application/x-ndjson":             {true, false},
		"application/json":                 {false, false},
		"":                                 {false, false},
	} {
		if s, sse := IsStream(ct); s != want[0] || sse != want[1] {
			t.Errorf("IsStream(%q) = %v, %v; want %v", ct, s, sse, want)
		}
	}
}

// BenchmarkStream is the ingress's and the worker's cost of reading a streamed answer for its
// usage: 256 OpenAI-style chunks and the include_usage chunk, written as they would arrive
// (one event a write).
func BenchmarkStream(b *testing.B) {
	chunk := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"token"}}],"usage":null}` + "\n\n")
	usage := []byte(`data: {"id":"chatcmpl-1","choices":[],"usage":{"prompt_tokens":40,"completion_tokens":256,"total_tokens":296}}` + "\n\ndata: [DONE]\n\n")
	c, _ := config.ParseCost("json:/usage/total_tokens", true)
	b.SetBytes(int64(256*len(chunk) + len(usage)))
	b.ReportAllocs()
	for b.Loop() {
		s := NewStream(true, c)
		for range 256 {
			s.Write(chunk)
		}
		s.Write(usage)
		s.End()
		if n, ok := s.Cost(c, nil); !ok || n != 296 {
			b.Fatal(n, ok)
		}
	}
}
