package cost

import (
	"bytes"
	"mime"
	"net/http"

	"github.com/sluice-rl/sluice/internal/config"
)

// # Streamed answers
//
// A streamed answer (text/event-stream, or JSON lines: application/x-ndjson,
// application/jsonl, application/json-seq) is not one JSON document but a run of events, each
// a JSON document: an SSE event's data lines (joined by newlines), or one line. A Stream reads
// a cost_from_response over such an answer as it flows: each json:<pointer> leaf of the
// expression takes the last value read at its pointer in any event, so that the final usage
// event counts (OpenAI's chunk with stream_options.include_usage; Anthropic's message_delta
// after its message_start). An event's value at /message+<pointer> is read when the event
// has none at <pointer>: Anthropic's message_start carries the Message object, whose usage the
// non-streamed answer has at the top, so one cost_from_response reads both answers. An event
// that is not JSON ("[DONE]", a comment, a keep-alive) is skipped.
//
// Costs: each event is scanned once per pointer (twice when it has none there), without
// decoding; the Stream holds at most one line of MaxReadAhead bytes (a longer line is
// skipped) and no part of the answer once its events are read.

// IsStream reports whether an answer with this Content-Type is streamed as events, and
// whether as server-sent events (else as JSON lines).
func IsStream(contentType string) (stream, sse bool) {
	if contentType == "" {
		return false, false
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false, false
	}
	switch mt {
	case "text/event-stream":
		return true, true
	case "application/x-ndjson", "application/jsonl", "application/json-seq", "application/jsonlines", "application/x-jsonlines":
		return true, false
	}
	return false, false
}

// Stream reads costs over a streamed answer as it flows (see IsStream). The zero Stream
// is not usable: NewStream.
type Stream struct {
	sse   bool
	ptrs  []string         // the json leaves of the costs read
	msg   []string         // each of ptrs under /message (Anthropic's message_start)
	vals  map[string]int64 // the last value read at each pointer
	data  []byte           // the SSE event being read: its data lines
	line  []byte           // a line not ended yet
	long  bool             // the current line is over MaxReadAhead: skipped to its end
	delta int64            // events that carried no value at any pointer
	usage int64            // events that carried a value at some pointer
}

// NewStream returns a Stream that reads the json leaves of costs over server-sent events (sse)
// or JSON lines.
func NewStream(sse bool, costs ...config.Cost) *Stream {
	s := &Stream{sse: sse, vals: map[string]int64{}}
	seen := map[string]bool{}
	var add func(c config.Cost)
	add = func(c config.Cost) {
		if c.Kind == config.CostJSON && !seen[c.Name] {
			seen[c.Name] = true
			s.ptrs, s.msg = append(s.ptrs, c.Name), append(s.msg, "/message"+c.Name)
		}
		for _, a := range c.Args {
			add(a)
		}
	}
	for _, c := range costs {
		add(c)
	}
	return s
}

// Write reads the next bytes of the answer.
func (s *Stream) Write(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			s.hold(p)
			return
		}
		if len(s.line) > 0 || s.long {
			s.hold(p[:i])
			if !s.long {
				s.lineDone(s.line)
			}
			s.line, s.long = s.line[:0], false
		} else {
			s.lineDone(p[:i])
		}
		p = p[i+1:]
	}
}

// hold keeps the start of a line that has not ended, up to MaxReadAhead.
func (s *Stream) hold(p []byte) {
	if s.long {
		return
	}
	if len(s.line)+len(p) > config.MaxReadAhead {
		s.line, s.long = s.line[:0], true
		return
	}
	s.line = append(s.line, p...)
}

// End reads what the answer left without a final newline (a last JSON line, an SSE event
// without its blank line).
func (s *Stream) End() {
	if len(s.line) > 0 && !s.long {
		s.lineDone(s.line)
	}
	s.line, s.long = nil, false
	if s.sse {
		s.lineDone(nil)
	}
}

func (s *Stream) lineDone(line []byte) {
	line = bytes.TrimSuffix(line, []byte{'\r'})
	if !s.sse {
		s.event(line)
		return
	}
	if len(line) == 0 { // the blank line ends an event
		if len(s.data) > 0 {
			s.event(s.data)
			s.data = s.data[:0]
		}
		return
	}
	d, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return // event:, id:, retry:, or a comment
	}
	d = bytes.TrimPrefix(d, []byte{' '})
	if len(s.data) > 0 {
		s.data = append(s.data, '\n')
	}
	if len(s.data)+len(d) > config.MaxReadAhead {
		return
	}
	s.data = append(s.data, d...)
}

// event reads one event's JSON document.
func (s *Stream) event(doc []byte) {
	doc = bytes.TrimSpace(doc)
	if len(doc) == 0 || doc[0] != '{' {
		return // [DONE], a keep-alive: only an object carries usage
	}
	read := false
	for i, p := range s.ptrs {
		n, ok := Pointer(doc, p)
		if !ok {
			n, ok = Pointer(doc, s.msg[i])
		}
		if ok {
			s.vals[p], read = n, true
		}
	}
	if read {
		s.usage++
	} else {
		s.delta++
	}
}

// Cost reads c, a cost_from_response, from the events read so far (its json leaves, each the
// last value read at its pointer) and from the answer's header h. ok is false when it cannot
// be read: a leaf of a sum never read, say.
func (s *Stream) Cost(c config.Cost, h http.Header) (int64, bool) {
	return s.eval(c, h, false)
}

// Seen is what the events read so far say of c, a leaf never read counting 0, plus one
// unit for each event that carried no value at any of its pointers (a delta): the charge of a
// stream cut short when its rule says cost_on_cut: deltas.
func (s *Stream) Seen(c config.Cost, h http.Header) int64 {
	n, _ := s.eval(c, h, true)
	return min(n+s.delta, config.MaxCost)
}

// Events reports the events read: those that carried a value at some pointer (usage) and the
// others (deltas).
func (s *Stream) Events() (usage, deltas int64) { return s.usage, s.delta }

func (s *Stream) eval(c config.Cost, h http.Header, zero bool) (int64, bool) {
	switch c.Kind {
	case config.CostHeader:
		n, ok := headerNumber(h, c.Name)
		return n, ok || zero
	case config.CostJSON:
		n, ok := s.vals[c.Name]
		return n, ok || zero
	case config.CostMax:
		var most int64
		read := false
		for _, a := range c.Args {
			if n, ok := s.eval(a, h, zero); ok {
				most, read = max(most, n), true
			}
		}
		return most, read
	case config.CostSum:
		var sum int64
		for _, a := range c.Args {
			n, ok := s.eval(a, h, zero)
			if !ok {
				return 0, false
			}
			sum = min(sum+n, config.MaxCost)
		}
		return sum, true
	case config.CostScaled:
		n, ok := s.eval(c.Args[0], h, zero)
		if !ok {
			return 0, false
		}
		if n > config.MaxCost/c.N {
			return config.MaxCost, true
		}
		return n * c.N, true
	}
	return 0, zero
}
