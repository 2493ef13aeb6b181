package queue

import (
	"github.com/sluice-rl/sluice/jsonw"

	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
)

// Headers of the messages this package writes.
const (
	hdrJob  = "Sluice-Job"         // the Job as JSON, without its body
	hdrDead = "Sluice-Dead-Letter" // deadMeta as JSON, on dead letters

	// The JetStream headers Publish sets itself, already in canonical form, instead of through
	// jetstream's options (which canonicalise and allocate per call).
	hdrMsgID          = "Nats-Msg-Id"
	hdrExpectedStream = "Nats-Expected-Stream"
)

// envelope is the JSON form of a Job in the Sluice-Job header, for decoding. JSON strings hold
// only valid UTF-8, so when a header value is not (HTTP allows obs-text bytes), all header
// values travel base64-encoded in Header64 instead, and replay byte-exact either way.
type envelope struct {
	*Job
	Header64 http.Header `json:"header_b64,omitempty"`
}

// encode builds the message of job on subject: the job's JSON in a header and its body,
// byte-exact, as the payload.
func encode(subject string, job *Job) (*nats.Msg, error) {
	meta, err := appendEnvelope(make([]byte, 0, envelopeSize(job)), job)
	if err != nil {
		return nil, fmt.Errorf("queue: encode job %s: %w", job.ID, err)
	}
	return &nats.Msg{Subject: subject, Header: nats.Header{hdrJob: {string(meta)}}, Data: job.Body}, nil
}

// envelopeSize estimates the length of job's envelope, to size its buffer in one allocation.
func envelopeSize(job *Job) int {
	n := 160 + len(job.ID) + len(job.Queue) + len(job.Method) + len(job.Path) + len(job.IdempotencyKey) + len(job.Tenant) + 40 +
		traceSize(job.Trace) + 21*len(job.Costs)
	for k, vs := range job.Header {
		n += len(k) + 8
		for _, v := range vs {
			n += len(v) + 4
		}
	}
	return n + n/8 // escapes; base64 needs a third more, and then append grows once
}

func traceSize(tc *TraceContext) int {
	if tc == nil {
		return 0
	}
	return len(tc.Traceparent) + len(tc.Tracestate) + 48
}

// appendEnvelope appends the JSON of job's envelope to b: the same document encoding/json makes
// of envelope{Job: job} (decode reads it by hand, readEnvelope), written directly because
// reflection was the largest allocation of a publish. Header names are sorted, as
// encoding/json sorts map keys.
func appendEnvelope(b []byte, job *Job) ([]byte, error) {
	if y := job.CreatedAt.Year(); y < 0 || y > 9999 {
		return nil, errors.New("created_at: year outside of range [0,9999]")
	}
	if y := job.NotBefore.Year(); !job.NotBefore.IsZero() && (y < 0 || y > 9999) {
		return nil, errors.New("not_before: year outside of range [0,9999]")
	}
	b = append(b, `{"id":`...)
	b = jsonw.AppendString(b, job.ID)
	b = append(b, `,"queue":`...)
	b = jsonw.AppendString(b, job.Queue)
	if job.Method != "" {
		b = append(b, `,"method":`...)
		b = jsonw.AppendString(b, job.Method)
	}
	if job.Path != "" {
		b = append(b, `,"path":`...)
		b = jsonw.AppendString(b, job.Path)
	}
	if job.Direct {
		b = append(b, `,"direct":true`...)
	}
	b64 := !headerUTF8(job.Header)
	if len(job.Header) > 0 && !b64 {
		b = append(b, `,"header":`...)
		b = appendHeader(b, job.Header, false)
	}
	b = append(b, `,"created_at":"`...)
	b = job.CreatedAt.AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	if job.IdempotencyKey != "" {
		b = append(b, `,"idempotency_key":`...)
		b = jsonw.AppendString(b, job.IdempotencyKey)
	}
	if !job.AckBy.IsZero() {
		b = append(b, `,"ack_by":"`...)
		b = job.AckBy.AppendFormat(b, time.RFC3339Nano)
		b = append(b, '"')
	}
	if job.Tenant != "" {
		b = append(b, `,"tenant":`...)
		b = jsonw.AppendString(b, job.Tenant)
	}
	b = appendCosts(b, job)
	if !job.NotBefore.IsZero() {
		b = append(b, `,"not_before":"`...)
		b = job.NotBefore.AppendFormat(b, time.RFC3339Nano)
		b = append(b, '"')
	}
	if job.Priority != "" {
		b = append(b, `,"priority":`...)
		b = jsonw.AppendString(b, string(job.Priority))
	}
	b = appendTrace(b, job.Trace)
	if len(job.Header) > 0 && b64 {
		b = append(b, `,"header_b64":`...)
		b = appendHeader(b, job.Header, true)
	}
	return append(b, '}'), nil
}

// appendCosts appends the cost and costs fields of job; nothing for those it has not.
func appendCosts(b []byte, job *Job) []byte {
	if job.Cost != 0 {
		b = append(b, `,"cost":`...)
		b = strconv.AppendInt(b, job.Cost, 10)
	}
	if len(job.Costs) > 0 {
		b = append(b, `,"costs":[`...)
		for i, c := range job.Costs {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, c, 10)
		}
		b = append(b, ']')
	}
	return b
}

// appendTrace appends the trace field of a job with trace context tc; nothing for nil.
func appendTrace(b []byte, tc *TraceContext) []byte {
	if tc == nil {
		return b
	}
	b = append(b, `,"trace":{"traceparent":`...)
	b = jsonw.AppendString(b, tc.Traceparent)
	if tc.Tracestate != "" {
		b = append(b, `,"tracestate":`...)
		b = jsonw.AppendString(b, tc.Tracestate)
	}
	return append(b, '}')
}

// appendHeader appends h as a JSON object of string arrays, names sorted; with b64 each value
// is base64-encoded.
func appendHeader(b []byte, h http.Header, b64 bool) []byte {
	var arr [32]string
	keys := arr[:0]
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonw.AppendString(b, k)
		b = append(b, ':')
		vs := h[k]
		if vs == nil {
			b = append(b, "null"...)
			continue
		}
		b = append(b, '[')
		for j, v := range vs {
			if j > 0 {
				b = append(b, ',')
			}
			if b64 {
				b = append(b, '"')
				b = base64.StdEncoding.AppendEncode(b, []byte(v))
				b = append(b, '"')
			} else {
				b = jsonw.AppendString(b, v)
			}
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

func headerUTF8(h http.Header) bool {
	for k, vs := range h {
		if !utf8.ValidString(k) {
			return false
		}
		for _, v := range vs {
			if !utf8.ValidString(v) {
				return false
			}
		}
	}
	return true
}

// decode reverses encode: by hand for the documents appendEnvelope writes (readEnvelope), with
// encoding/json for any other.
func decode(h nats.Header, data []byte) (*Job, error) {
	meta := h.Get(hdrJob)
	if meta == "" {
		return nil, errors.New("queue: message has no " + hdrJob + " header")
	}
	var j Job
	env := envelope{Job: &j}
	if !readEnvelope(meta, &j) {
		j = Job{}
		if err := json.Unmarshal([]byte(meta), &env); err != nil {
			return nil, fmt.Errorf("queue: decode job: %w", err)
		}
	}
	if env.Header64 != nil {
		j.Header = make(http.Header, len(env.Header64))
		for k, vs := range env.Header64 {
			for _, v := range vs {
				b, err := base64.StdEncoding.DecodeString(v)
				if err != nil {
					return nil, fmt.Errorf("queue: decode job header %s: %w", k, err)
				}
				j.Header[k] = append(j.Header[k], string(b))
			}
		}
	}
	j.tickets = parseTickets(h.Get(hdrTickets))
	if j.Body = data; j.Body == nil {
		j.Body = []byte{}
	}
	return &j, nil
}
