package queue_test

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/queue"
)

// TestRecordsInOneRead: Records returns, for a mix of jobs with records, jobs without, one
// whose record was updated and an invalid id, what Record returns for each job that has one,
// and nothing for the others.
func TestRecordsInOneRead(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "orders"})
	created := time.Date(2026, 11, 24, 9, 0, 0, 0, time.UTC)
	var ids []string
	for i := range 12 {
		id := b.publish(&queue.Job{Queue: "orders", Body: []byte("x"), CreatedAt: created}).ID
		ids = append(ids, id)
		if i%3 == 0 {
			continue // no record: a job that was never delivered
		}
		st := queue.Status{ID: id, Queue: "orders", State: queue.StateSucceeded, Attempts: 1, Delivered: 1, CreatedAt: created}
		if i%3 == 2 {
			st.State, st.LastError = queue.StateRetrying, fmt.Sprintf("attempt %d failed", i)
		}
		if err := b.q.SetStatus(b.ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	// An update: the last entry is the one read.
	if err := b.q.SetStatus(b.ctx, queue.Status{ID: ids[2], Queue: "orders", State: queue.StateSucceeded, Attempts: 2, Delivered: 2, CreatedAt: created}); err != nil {
		t.Fatal(err)
	}
	got, err := b.q.Records(b.ctx, append(ids, "not an id"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]queue.Status{}
	for _, id := range ids {
		st, err := b.q.Record(b.ctx, id)
		if errors.Is(err, queue.ErrNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		want[id] = st
	}
	if len(want) != 8 {
		t.Fatalf("%d jobs have records, want 8", len(want))
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Records:\n%v\nRecord of each:\n%v", got, want)
	}
	if got[ids[2]].Attempts != 2 {
		t.Fatalf("an updated record read as %+v, want its last entry", got[ids[2]])
	}
	none, err := b.q.Records(b.ctx, []string{ids[0], ids[3]})
	if err != nil || len(none) != 0 {
		t.Fatalf("Records of jobs without records: %v, %v; want none", none, err)
	}
}
