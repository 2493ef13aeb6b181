package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/queue"
)

// calls is the order of the calls an executor made, shared by a fakeStore and a fakeMsg.
type calls struct {
	mu  sync.Mutex
	log []string
}

func (c *calls) add(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.log = append(c.log, fmt.Sprintf(format, args...))
}

func (c *calls) get() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.log)
}

// fakeStore is the executor's jobStore, recording what it was asked. With block set, every
// call waits for its context to end and returns its error: NATS that does not answer.
type fakeStore struct {
	*calls
	block    bool
	failSet  bool
	statuses []queue.Status
}

func (s *fakeStore) wait(ctx context.Context) error {
	if s.block {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func (s *fakeStore) Record(ctx context.Context, id string) (queue.Status, error) {
	s.add("status %s", id)
	return queue.Status{}, s.wait(ctx)
}

func (s *fakeStore) SetStatus(ctx context.Context, st queue.Status) error {
	s.add("record %s %d", st.State, st.Attempts)
	s.mu.Lock()
	s.statuses = append(s.statuses, st)
	s.mu.Unlock()
	if s.failSet {
		return errors.New("nats: timeout")
	}
	return s.wait(ctx)
}

func (s *fakeStore) ClaimAttempt(ctx context.Context, st queue.Status) error {
	s.add("claim %d", st.Attempts)
	return s.wait(ctx)
}

func (s *fakeStore) DeadLetter(ctx context.Context, m *queue.Msg, reason string, lastStatus, attempts int) error {
	s.add("dead-letter %q %d %d", reason, lastStatus, attempts)
	return s.wait(ctx)
}

// fakeMsg is a job's message, recording how it was settled.
type fakeMsg struct {
	*calls
	block bool
}

func (m *fakeMsg) wait(ctx context.Context) error {
	if m.block {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func (m *fakeMsg) Ack(ctx context.Context) error { m.add("ack"); return m.wait(ctx) }
func (m *fakeMsg) AckNoWait() error              { m.add("ack-no-wait"); return nil }
func (m *fakeMsg) Nak(ctx context.Context) error { m.add("nak"); return m.wait(ctx) }
func (m *fakeMsg) NakWithDelay(ctx context.Context, d time.Duration) error {
	m.add("nak after %v", d)
	return m.wait(ctx)
}
func (m *fakeMsg) InProgress(ctx context.Context) error { m.add("in progress"); return m.wait(ctx) }

func newFakeExecutor(t *testing.T, ctx context.Context, store *fakeStore) *executor {
	t.Helper()
	m, err := newMetrics(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 24, 9, 0, 0, 0, time.UTC)
	return &executor{ctx: ctx, store: store, m: m, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		now: func() time.Time { return now }}
}

func fakeJob(c *calls, block bool) *job {
	qm := &queue.Msg{Job: &queue.Job{ID: "j1", CreatedAt: time.Date(2026, 11, 24, 8, 0, 0, 0, time.UTC)}, Delivered: 1}
	return &job{m: qm, msg: &fakeMsg{calls: c, block: block}, queue: "q", state: jobState{delivered: 1}}
}

// apply carries a plan out in order: pause, record, settlement; an ack is unconfirmed only when
// the final status is known to be recorded.
func TestApply(t *testing.T) {
	tests := []struct {
		name    string
		p       plan
		failSet bool
		want    []string
	}{
		{name: "success: record, then an unconfirmed ack",
			p:    plan{how: ack, record: &record{state: queue.StateSucceeded, attempts: 1}},
			want: []string{"record succeeded 1", "ack-no-wait"}},
		{name: "success whose record failed: the ack is confirmed", failSet: true,
			p:    plan{how: ack, record: &record{state: queue.StateSucceeded, attempts: 1}},
			want: []string{"record succeeded 1", "ack"}},
		{name: "already final: an unconfirmed ack and no record",
			p: plan{how: ack, final: true, skipped: true}, want: []string{"ack-no-wait"}},
		{name: "retry: record, then nak after the delay",
			p:    plan{how: nak, delay: 3 * time.Second, record: &record{state: queue.StateRetrying, attempts: 1, next: 3 * time.Second, hasNext: true}},
			want: []string{"record retrying 1", "nak after 3s"}},
		{name: "hand back: record, then nak at once",
			p:    plan{how: handBack, record: &record{state: queue.StateQueued}},
			want: []string{"record queued 0", "nak"}},
		{name: "dead letter: the dead-letter stream records the status itself",
			p:    plan{how: deadLetter, reason: reasonPermanent, deadErr: "upstream answered 404 Not Found", deadStatus: 404, deadAttempts: 1},
			want: []string{`dead-letter "permanent: upstream answered 404 Not Found" 404 1`}},
		{name: "too many pause retries: the unspent attempt is recorded before the dead letter",
			p: plan{pause: time.Second, how: deadLetter, record: &record{state: queue.StateRetrying, attempts: 0},
				reason: reasonMaxPauseRetries, deadErr: "x", deadStatus: 429},
			want: []string{"record retrying 0", `dead-letter "max_pause_retries: x" 429 0`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &calls{}
			e := newFakeExecutor(t, context.Background(), &fakeStore{calls: c, failSet: tt.failSet})
			e.apply(fakeJob(c, false), tt.p)
			if got := c.get(); !slices.Equal(got, tt.want) {
				t.Errorf("calls = %q, want %q", got, tt.want)
			}
		})
	}
}

// A retry's record says when the job is tried next, and keeps the job's creation time.
func TestApplyRecordsNextAttempt(t *testing.T) {
	c := &calls{}
	store := &fakeStore{calls: c}
	e := newFakeExecutor(t, context.Background(), store)
	j := fakeJob(c, false)
	e.apply(j, plan{how: nak, delay: 5 * time.Second, record: &record{state: queue.StateRetrying, attempts: 1, next: 5 * time.Second, hasNext: true}})
	st := store.statuses[0]
	if want := e.now().Add(5 * time.Second); st.NextAttemptAt == nil || !st.NextAttemptAt.Equal(want) {
		t.Errorf("next attempt at %v, want %v", st.NextAttemptAt, want)
	}
	if !st.CreatedAt.Equal(j.m.Job.CreatedAt) || st.Delivered != 1 || st.Queue != "q" {
		t.Errorf("status = %+v, want the job's creation time, delivery 1, queue q", st)
	}
}

// The outcome is recorded only once the delivery's running record has landed.
func TestApplyWaitsForTheRunningRecord(t *testing.T) {
	c := &calls{}
	e := newFakeExecutor(t, context.Background(), &fakeStore{calls: c})
	j := fakeJob(c, false)
	j.running = e.recordRunning(j, 1, 0)
	e.apply(j, plan{how: ack, record: &record{state: queue.StateSucceeded, attempts: 1}})
	want := []string{"record running 1", "record succeeded 1", "ack-no-wait"}
	if got := c.get(); !slices.Equal(got, want) {
		t.Errorf("calls = %q, want %q", got, want)
	}
}

// A running record not yet started when the delivery ends is not written at all.
func TestApplyCancelsALateRunningRecord(t *testing.T) {
	c := &calls{}
	e := newFakeExecutor(t, context.Background(), &fakeStore{calls: c})
	j := fakeJob(c, false)
	j.running = e.recordRunning(j, 1, time.Hour)
	e.apply(j, plan{how: ack, record: &record{state: queue.StateSucceeded, attempts: 1}})
	want := []string{"record succeeded 1", "ack-no-wait"}
	if got := c.get(); !slices.Equal(got, want) {
		t.Errorf("calls = %q, want %q", got, want)
	}
}

// When the broker does not answer, apply gives up as soon as its context ends, not after each
// call's own timeout: what lets a shutdown keep its timeout while NATS is down.
func TestApplyEndsWithItsContext(t *testing.T) {
	c := &calls{}
	ctx, cancel := context.WithCancel(context.Background())
	e := newFakeExecutor(t, ctx, &fakeStore{calls: c, block: true})
	j := fakeJob(c, true)
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.apply(j, plan{how: handBack, record: &record{state: queue.StateRetrying, attempts: 1}})
	}()
	waitFor(t, func() bool { return len(c.get()) >= 1 })
	select {
	case <-done:
		t.Fatal("apply returned while its record write was still waiting")
	default:
	}
	cancel()
	select {
	case <-done:
	case <-time.After(opTimeout / 2):
		t.Fatalf("apply still running %v after its context ended", opTimeout/2)
	}
	if want := []string{"record retrying 1", "nak"}; !slices.Equal(c.get(), want) {
		t.Errorf("calls = %q, want %q", c.get(), want)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}
