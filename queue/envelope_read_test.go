package queue

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// jsonEnvelope decodes meta as decode did before readEnvelope: with encoding/json alone.
func jsonEnvelope(meta string) (*Job, bool) {
	var j Job
	env := envelope{Job: &j}
	if err := json.Unmarshal([]byte(meta), &env); err != nil || env.Header64 != nil {
		return nil, false
	}
	return &j, true
}

// checkReadEnvelope fails t when readEnvelope reads meta to a job other than encoding/json's,
// and reports whether it read it.
func checkReadEnvelope(t *testing.T, meta string) bool {
	t.Helper()
	var got Job
	if !readEnvelope(meta, &got) {
		return false
	}
	want, ok := jsonEnvelope(meta)
	if !ok {
		t.Fatalf("readEnvelope read %q, which encoding/json refuses (or reads as base64 headers)", meta)
	}
	if !reflect.DeepEqual(&got, want) {
		t.Fatalf("readEnvelope(%q)\n = %#v\nwant %#v", meta, got, *want)
	}
	return true
}

// The envelopes appendEnvelope writes are read by hand, to the job encoding/json reads, unless
// their headers are not UTF-8 (header_b64); other documents are left to encoding/json.
func TestReadEnvelope(t *testing.T) {
	job := &Job{
		ID: NewJobID("orders"), Queue: "orders", Method: "POST", Path: "/api/orders?x=1&y=2",
		Header: http.Header{
			"Content-Type": {"application/json"}, "X-Forwarded-For": {"10.0.0.1", "10.0.0.2"},
			"Accept": {}, "User-Agent": {"curl/8.0"},
		},
		CreatedAt:      time.Date(2026, 11, 23, 9, 30, 0, 123456789, time.UTC),
		IdempotencyKey: "order-42", AckBy: time.Date(2026, 11, 23, 9, 30, 5, 0, time.FixedZone("", 3600)),
		Tenant: "t1", Cost: 1500, Costs: []int64{1200, 16000},
		Trace: &TraceContext{Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Tracestate: "vendor=a"},
	}
	for _, j := range []*Job{job, {ID: "x", Queue: "q", Direct: true, CreatedAt: time.Unix(0, 0).UTC()}} {
		meta, err := appendEnvelope(nil, j)
		if err != nil {
			t.Fatal(err)
		}
		if !checkReadEnvelope(t, string(meta)) {
			t.Fatalf("%s was left to encoding/json", meta)
		}
	}
	// Every envelope appendEnvelope writes with UTF-8 headers (escapes, times in any zone of whole minutes).
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 3000 {
		invalid := i%3 == 0
		j := &Job{ID: NewJobID("q"), Queue: randString(r, false), Method: randString(r, invalid),
			Path: randString(r, invalid), Direct: r.IntN(2) == 0, IdempotencyKey: randString(r, false),
			// Zones of whole minutes: RFC 3339 has no seconds of offset, which makes a time
			// with them not canonical.
			CreatedAt: time.Unix(r.Int64N(1<<35), r.Int64N(1e9)).In(time.FixedZone("", (r.IntN(1600)-800)*60)),
			Tenant:    randString(r, false), Cost: r.Int64N(3) * r.Int64N(1<<40)}
		for range r.IntN(3) {
			j.Costs = append(j.Costs, r.Int64N(3)*r.Int64N(1<<40)-r.Int64N(2))
		}
		if r.IntN(2) == 0 {
			j.AckBy = j.CreatedAt.Add(time.Duration(r.Int64N(1e10)))
		}
		if r.IntN(2) == 0 {
			j.Trace = &TraceContext{Traceparent: randString(r, false), Tracestate: randString(r, false)}
		}
		if n := r.IntN(4); n > 0 {
			j.Header = http.Header{}
			for range n {
				vs := []string{}
				for range r.IntN(3) {
					vs = append(vs, randString(r, invalid))
				}
				j.Header[randString(r, false)] = vs
			}
		}
		meta, err := appendEnvelope(nil, j)
		if err != nil {
			t.Fatal(err)
		}
		if read := checkReadEnvelope(t, string(meta)); read != headerUTF8(j.Header) {
			t.Fatalf("%s: read by hand %v, headers UTF-8 %v", meta, read, headerUTF8(j.Header))
		}
	}
	// Documents it leaves to encoding/json, each of which encoding/json reads.
	for _, meta := range []string{
		`{"id":"a","queue":"q","path":"/\ud83d\ude00","created_at":"2026-11-23T09:30:00Z"}`,      // surrogate escapes
		`{"id":"a","queue":"q","created_at":"2026-11-23T09:30:00.000Z"}`,                         // not canonical
		`{"id":"a","queue":"q","created_at":"2026-11-23T09:30:00+00:00"}`,                        // not canonical
		`{"queue":"q","id":"a","created_at":"2026-11-23T09:30:00Z"}`,                             // order
		`{"id":"a", "queue":"q","created_at":"2026-11-23T09:30:00Z"}`,                            // space
		`{"id":"a","queue":"q","created_at":"2026-11-23T09:30:00Z","extra":1}`,                   // unknown field
		`{"id":"a","queue":"q","created_at":"2026-11-23T09:30:00Z","cost":-0}`,                   // not as AppendInt writes
		`{"id":"a","queue":"q","created_at":"2026-11-23T09:30:00Z","costs":[]}`,                  // never written empty
		`{"id":"a","queue":"q","created_at":"2026-11-23T09:30:00Z","costs":[1, 2]}`,              // space
		`{"id":"a","queue":"q","created_at":"2026-11-23T09:30:00Z","costs":[-0]}`,                // not as AppendInt writes
		`{"id":"a","queue":"q","header":{"A":null},"created_at":"2026-11-23T09:30:00Z"}`,         // null values
		`{"id":"a","queue":"q","created_at":"2026-11-23T09:30:00Z","header_b64":{"A":["eA=="]}}`, // base64
		`{"id":"a","queue":"q","created_at":"2026-11-23T09:30:00Z","trace":null}`,                // null
		`{"id":"a","queue":"q","created_at":"2026-11-23T09:30:00Z","trace":{"tracestate":"x"}}`,  // order
	} {
		if checkReadEnvelope(t, meta) {
			t.Fatalf("%s was read by hand", meta)
		}
		if _, err := decode(map[string][]string{hdrJob: {meta}}, nil); err != nil {
			t.Fatalf("decode %s: %v", meta, err)
		}
	}
	// An escape in a time, which encoding/json refuses (time.Time reads the raw string).
	meta := `{"id":"a","queue":"q","created_at":"\u0032026-11-23T09:30:00Z"}`
	if checkReadEnvelope(t, meta) {
		t.Fatalf("%s was read by hand", meta)
	}
	if _, err := decode(map[string][]string{hdrJob: {meta}}, nil); err == nil {
		t.Fatalf("decode %s: no error", meta)
	}
}

// Whatever readEnvelope accepts, encoding/json reads to the same job.
func FuzzReadEnvelope(f *testing.F) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 50 {
		job := &Job{ID: NewJobID("q"), Queue: randString(r, false), Method: randString(r, false),
			Path: randString(r, false), Direct: r.IntN(2) == 0, IdempotencyKey: randString(r, false),
			CreatedAt: time.Unix(r.Int64N(1<<35), r.Int64N(1e9)).In(time.FixedZone("", r.IntN(50000)-25000))}
		if r.IntN(2) == 0 {
			job.Header = http.Header{randString(r, false): {randString(r, false)}, "B": {}}
		}
		meta, err := appendEnvelope(nil, job)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(meta))
	}
	f.Add(`{"id":"a","queue":"q","created_at":"2026-11-23T09:30:00Z"}`)
	f.Add(`{"id":"a","queue":"q","created_at":"2026-11-23T09:30:00Z","tenant":"t","cost":2000}`)
	f.Add(`{"id":"a","queue":"q","created_at":"2026-11-23T09:30:00Z","cost":-07}`)
	f.Add(`{"id":"a\u0026b","queue":"q","header":{"A":["\u00e9"]},"created_at":"\u0032026-11-23T09:30:00Z"}`)
	f.Fuzz(func(t *testing.T, meta string) { checkReadEnvelope(t, meta) })
}

func BenchmarkDecode(b *testing.B) {
	job := &Job{
		ID: NewJobID("orders"), Queue: "orders", Method: "POST", Path: "/api/orders",
		Header: http.Header{"Content-Type": {"application/json"}, "User-Agent": {"wrk"},
			"X-Forwarded-For": {"127.0.0.1"}, "X-Forwarded-Host": {"127.0.0.1:19202"}, "X-Forwarded-Proto": {"http"}},
		CreatedAt: time.Now().UTC(), AckBy: time.Now().Add(5 * time.Second).UTC(),
	}
	meta, err := appendEnvelope(nil, job)
	if err != nil {
		b.Fatal(err)
	}
	h := map[string][]string{hdrJob: {string(meta)}}
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decode(h, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	// Escapes in strings: the reader's slow path.
	esc := *job
	esc.Path, esc.Header = `/api/orders?q="a<b"&t=x\y`, http.Header{"X-Note": {"tab\there, \"quoted\" <é>"}}
	escMeta, err := appendEnvelope(nil, &esc)
	if err != nil {
		b.Fatal(err)
	}
	escH := map[string][]string{hdrJob: {string(escMeta)}}
	b.Run("hand-escaped", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if j, err := decode(escH, nil); err != nil || j.Path != esc.Path {
				b.Fatal(j, err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := jsonEnvelope(string(meta)); !ok {
				b.Fatal("not decoded")
			}
		}
	})
}

// BenchmarkFairCost is what a fair queue's scheduler spends per job moved to read its cost, by
// units (FairLayout.Cost): the envelope decoded by hand, its body not read.
func BenchmarkFairCost(b *testing.B) {
	job := &Job{
		ID: NewJobID("llm"), Queue: "llm", Method: "POST", Path: "/v1/chat/completions",
		Header:    http.Header{"Content-Type": {"application/json"}, "Authorization": {"Bearer x"}},
		CreatedAt: time.Now().UTC(), AckBy: time.Now().Add(5 * time.Second).UTC(), Tenant: "0123456789abcdef", Cost: 2048,
	}
	meta, err := appendEnvelope(nil, job)
	if err != nil {
		b.Fatal(err)
	}
	raw := &jetstream.RawStreamMsg{Header: nats.Header{hdrJob: {string(meta)}}}
	var l FairLayout
	b.ReportAllocs()
	for b.Loop() {
		if c := l.Cost(raw); c != 2048 {
			b.Fatal(c)
		}
	}
}
