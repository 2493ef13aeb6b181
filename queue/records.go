package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
)

// ErrNoBatchGet is returned (wrapped) by Records when the server cannot answer a batched read:
// a nats-server before 2.11, or a status bucket without direct gets. Read each job's Record.
var ErrNoBatchGet = errors.New("queue: batched reads of records unavailable")

// Records returns the status records of the jobs ids that have one, read in one round trip:
// one batched direct get of the status bucket's stream for the last entry of each id
// ("multi_last", nats-server ≥ 2.11). A job without an entry (or whose entry was deleted) is
// absent from the map; invalid ids are skipped. Each record is what Record returns. A worker
// reads the records of a fetched batch this way instead of one Record per job.
//
// On a server that cannot answer it returns ErrNoBatchGet, from then on without asking, and
// any other failure as an error; the caller then reads each Record.
func (p Publisher) Records(ctx context.Context, ids []string) (map[string]Status, error) {
	if p.noBatchGet.Load() {
		return nil, ErrNoBatchGet
	}
	prefix := "$KV." + p.bucketName() + "."
	subjects := make([]string, 0, len(ids))
	for _, id := range ids {
		if validID(id) {
			subjects = append(subjects, prefix+id)
		}
	}
	out := make(map[string]Status, len(subjects))
	if len(subjects) == 0 {
		return out, nil
	}
	ctx, cancel := withDefaultTimeout(ctx, opTimeout)
	defer cancel()
	nc := p.js.Conn()
	inbox := nc.NewRespInbox()
	// A channel of its own: SubscribeSync's holds 65 536 messages, and allocating it cost
	// more than the read. The answer is at most one message per id and the end of batch.
	ch := make(chan *nats.Msg, len(subjects)+1)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, fmt.Errorf("queue: records: %w", err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // the inbox is this call's alone
	req, err := json.Marshal(struct {
		MultiLast []string `json:"multi_last"`
		Batch     int      `json:"batch"`
	}{subjects, len(subjects)})
	if err != nil {
		return nil, err
	}
	if err := nc.PublishRequest(p.api+"DIRECT.GET.KV_"+p.bucketName(), inbox, req); err != nil {
		return nil, fmt.Errorf("queue: records: %w", err)
	}
	for {
		var m *nats.Msg
		select {
		case m = <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("queue: records: %w", ctx.Err())
		}
		done, err := p.addRecord(out, m, prefix)
		if done || err != nil {
			return out, err
		}
	}
}

// addRecord adds the record m carries to out, or reports that m ends the answer (done): the
// end of the batch, or no entries at all.
func (q *core) addRecord(out map[string]Status, m *nats.Msg, prefix string) (done bool, err error) {
	switch status := m.Header.Get("Status"); status {
	case "":
	case "204", "404": // end of batch; no results
		return true, nil
	case "503", "400": // no direct gets of the bucket; a server before multi_last
		q.noBatchGet.Store(true)
		return true, fmt.Errorf("%w: %s %s", ErrNoBatchGet, status, m.Header.Get("Description"))
	default:
		return true, fmt.Errorf("queue: records: %s %s", status, m.Header.Get("Description"))
	}
	if op := m.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
		return false, nil
	}
	id, ok := strings.CutPrefix(m.Header.Get("Nats-Subject"), prefix)
	if !ok {
		return false, nil
	}
	var r record
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return true, fmt.Errorf("queue: status %s: %w", id, err)
	}
	out[id] = q.recordStatus(r)
	return false, nil
}
