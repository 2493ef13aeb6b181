package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/queue"
)

// downStore is a jobStore whose writes fail while down; it keeps the records written.
type downStore struct {
	mu      sync.Mutex
	down    bool
	records map[string]queue.Status
}

func (s *downStore) Record(_ context.Context, id string) (queue.Status, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return queue.Status{}, errors.New("nats: no responders")
	}
	st, ok := s.records[id]
	if !ok {
		return st, queue.ErrNotFound
	}
	return st, nil
}

func (s *downStore) ClaimAttempt(ctx context.Context, st queue.Status) error {
	return s.SetStatus(ctx, st)
}

func (s *downStore) SetStatus(_ context.Context, st queue.Status) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return errors.New("nats: no responders")
	}
	s.records[st.ID] = st
	return nil
}

func (s *downStore) DeadLetter(context.Context, *queue.Msg, string, int, int) error { return nil }

// TestOutbox: a record whose write failed is kept, read back for the job's next delivery, and
// written once the store answers; a record another worker wrote since is not overwritten.
func TestOutbox(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	store := &downStore{down: true, records: map[string]queue.Status{
		"b": {ID: "b", Attempts: 3, UpdatedAt: t0.Add(time.Second)}, // written by another worker later
	}}
	o := newOutbox()
	o.keep(queue.Status{ID: "a", Attempts: 1, UpdatedAt: t0}, log)
	o.keep(queue.Status{ID: "a", Attempts: 2, UpdatedAt: t0.Add(time.Millisecond)}, log)
	o.keep(queue.Status{ID: "a", Attempts: 1, UpdatedAt: t0}, log) // older: ignored
	o.keep(queue.Status{ID: "b", Attempts: 2, UpdatedAt: t0}, log)
	if st, ok := o.record("a"); !ok || st.Attempts != 2 {
		t.Fatalf("kept record of a: %+v %v; want attempts 2", st, ok)
	}
	o.flush(context.Background(), store, log)
	if o.size() != 2 {
		t.Fatalf("%d kept after a failed flush, want 2", o.size())
	}
	store.mu.Lock()
	store.down = false
	store.mu.Unlock()
	o.flush(context.Background(), store, log)
	if o.size() != 0 {
		t.Fatalf("%d kept after a flush that could write, want 0", o.size())
	}
	if store.records["a"].Attempts != 2 || store.records["b"].Attempts != 3 {
		t.Fatalf("records after the flush: %+v", store.records)
	}
}
