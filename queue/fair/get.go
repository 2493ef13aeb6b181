package fair

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/queue"
)

// directGet reads a tenant's share of a round from the backlog stream in one request: a
// batched direct get (JetStream 2.11+), answered with one message per stored job and then an
// end-of-batch status. nats.go v1.55 has no call for it: Stream.GetMsg asks for one message,
// and its options cannot add "batch" to the request. GetMsg per job costs a round trip per job
// (BenchmarkGetBatch compares the two); a consumer per tenant is what the backlog design
// avoids (docs/design/fair.md). A single job is read with GetMsg, and the single jobs of many
// tenants with one multi_last request (singles.go).
type directGet struct {
	nc   *nats.Conn
	subj string // the stream's DIRECT.GET API subject
}

// newDirectGet returns a batched reader of stream through js's connection and API prefix
// (queue.APIPrefix: a domain's, or the prefix js was made with, as the queue layer's own
// direct gets).
func newDirectGet(js jetstream.JetStream, stream string) directGet {
	return directGet{nc: js.Conn(), subj: queue.APIPrefix(js) + "DIRECT.GET." + stream}
}

// batch reads up to n messages on subject subj from sequence from on. It returns what it read
// before an error.
func (g directGet) batch(ctx context.Context, subj string, from uint64, n int) ([]*jetstream.RawStreamMsg, error) {
	req := fmt.Appendf(nil, `{"seq":%d,"next_by_subj":%q,"batch":%d}`, max(from, 1), subj, n)
	return g.ask(ctx, subj, req, n)
}

// maxMulti is how many subjects one multiLast asks for: the server answers at most 1 024.
const maxMulti = 256

// multiLast reads, in one request, the last message at or below sequence upTo on each of
// subjs (at most maxMulti, literal subjects). A subject with none has no message in the
// answer; the messages name their subjects. It returns what it read before an error.
func (g directGet) multiLast(ctx context.Context, subjs []string, upTo uint64) ([]*jetstream.RawStreamMsg, error) {
	req, err := json.Marshal(struct {
		Subjects []string `json:"multi_last"`
		UpTo     uint64   `json:"up_to_seq"`
		Batch    int      `json:"batch"`
	}{subjs, upTo, len(subjs)})
	if err != nil {
		return nil, err
	}
	return g.ask(ctx, "", req, len(subjs))
}

// ask sends direct get request req, answered with up to n messages and then an end-of-batch
// status, and returns the messages: on subject subj, or "" for the subjects the answer names.
func (g directGet) ask(ctx context.Context, subj string, req []byte, n int) ([]*jetstream.RawStreamMsg, error) {
	inbox := g.nc.NewRespInbox()
	// A channel the size of the answer: SubscribeSync's default one is 64k entries (512 KiB)
	// per call. The server sends at most n messages and a status, so it never overflows.
	ch := make(chan *nats.Msg, n+2)
	sub, err := g.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := g.nc.PublishRequest(g.subj, inbox, req); err != nil {
		return nil, err
	}
	what := cmp.Or(subj, "multi_last")
	var out []*jetstream.RawStreamMsg
	for {
		var m *nats.Msg
		select {
		case m = <-ch:
		case <-ctx.Done():
			return out, ctx.Err()
		}
		switch status := m.Header.Get("Status"); status {
		case "":
		case "404", "204": // none, or the end of the batch
			return out, nil
		default:
			return out, fmt.Errorf("fair: direct get %s: status %s %s", what, status, m.Header.Get("Description"))
		}
		seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return out, fmt.Errorf("fair: direct get %s: sequence: %w", what, err)
		}
		ts, _ := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
		out = append(out, &jetstream.RawStreamMsg{Subject: cmp.Or(subj, m.Header.Get(jetstream.SubjectHeader)),
			Sequence: seq, Header: m.Header, Data: m.Data, Time: ts})
	}
}
