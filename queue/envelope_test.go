package queue

import (
	"encoding/base64"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// referenceEnvelope is the envelope as encoding/json made it before appendEnvelope replaced it.
func referenceEnvelope(t *testing.T, job *Job) []byte {
	t.Helper()
	env := envelope{Job: job}
	if !headerUTF8(job.Header) {
		cp := *job
		cp.Header = nil
		env = envelope{Job: &cp, Header64: make(http.Header, len(job.Header))}
		for k, vs := range job.Header {
			for _, v := range vs {
				env.Header64[k] = append(env.Header64[k], base64.StdEncoding.EncodeToString([]byte(v)))
			}
		}
	}
	b, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// randString draws from the characters JSON escaping cares about: controls, quotes,
// backslashes, HTML, U+2028/2029, multi-byte runes and (with invalid) bytes that are not UTF-8.
func randString(r *rand.Rand, invalid bool) string {
	pieces := []string{"a", "Z", "0", " ", "\"", "\\", "/", "<", ">", "&", "\n", "\r", "\t", "\x00", "\x1f",
		"\x7f", "é", "€", "\u2028", "\u2029", "😀", "\ufffd", "+", "%20", "?", "="}
	if invalid {
		pieces = append(pieces, "\xff", "\xe9", "\xe2\x82")
	}
	var s string
	for range r.IntN(12) {
		s += pieces[r.IntN(len(pieces))]
	}
	return s
}

// The hand-written envelope is the document encoding/json made: byte for byte while the
// headers are valid UTF-8, and decoding to the same job otherwise.
func TestEnvelopeMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 5000 {
		invalid := i%3 == 0
		job := &Job{
			ID:             NewJobID("q"),
			Queue:          randString(r, false),
			Method:         randString(r, invalid),
			Path:           randString(r, invalid),
			Direct:         r.IntN(2) == 0,
			CreatedAt:      time.Unix(r.Int64N(1<<35), r.Int64N(1e9)).In(time.FixedZone("", r.IntN(50000)-25000)),
			IdempotencyKey: randString(r, false),
			Cost:           r.Int64N(2) * r.Int64N(1<<40),
		}
		for range r.IntN(3) {
			job.Costs = append(job.Costs, r.Int64N(1<<40))
		}
		if r.IntN(2) == 0 {
			job.Trace = &TraceContext{Traceparent: randString(r, false), Tracestate: randString(r, i%5 == 0)}
		}
		if n := r.IntN(4); n > 0 {
			job.Header = http.Header{}
			for range n {
				var vs []string
				for range r.IntN(3) {
					vs = append(vs, randString(r, invalid))
				}
				if vs == nil && r.IntN(2) == 0 {
					vs = []string{}
				}
				job.Header[randString(r, false)] = vs
			}
		}
		got, err := appendEnvelope(nil, job)
		if err != nil {
			t.Fatal(err)
		}
		want := referenceEnvelope(t, job)
		if headerUTF8(job.Header) && string(got) != string(want) {
			t.Fatalf("job %d:\n got %s\nwant %s", i, got, want)
		}
		a, err := decode(nats.Header{hdrJob: {string(got)}}, nil)
		if err != nil {
			t.Fatalf("job %d: decode %s: %v", i, got, err)
		}
		b, err := decode(nats.Header{hdrJob: {string(want)}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("job %d decodes to\n %+v\nnot\n %+v", i, a, b)
		}
	}
	if _, err := appendEnvelope(nil, &Job{CreatedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}); err == nil {
		t.Fatal("a year encoding/json refuses was encoded")
	}
}

func TestJobIDTag(t *testing.T) {
	for _, q := range []string{"orders", "mail", "a", "Q_1-x"} {
		id := NewJobID(q)
		if !findable(q, id) {
			t.Fatalf("JobID(%q) = %s does not end with the queue's tag %04x", q, id, queueTag(q))
		}
		keyed := IDs{secret: []byte("0123456789abcdef")}
		if findable(q, keyed.JobID(q, "", "key")) && findable(q, keyed.JobID(q, "", "key2")) {
			t.Fatalf("keyed ids of %q carry its tag", q)
		}
	}
	if queueTag("orders") == queueTag("mail") {
		t.Fatal("distinct names, one tag")
	}
	for _, id := range []string{"", "abc", "xyz-ghij"} {
		if _, ok := idTag(id); ok {
			t.Fatalf("idTag(%q) found a tag", id)
		}
	}
}

func BenchmarkEncode(b *testing.B) {
	job := &Job{ID: NewJobID("orders"), Queue: "orders", Method: "POST", Path: "/api/orders?x=1",
		Header:    http.Header{"Content-Type": {"application/json"}, "X-Api-Key": {"k-123"}, "Accept": {"*/*"}},
		CreatedAt: time.Now().UTC()}
	b.Run("appendEnvelope", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := appendEnvelope(make([]byte, 0, envelopeSize(job)), job); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(envelope{Job: job}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
