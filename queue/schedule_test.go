package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// moveUntil calls MoveDue on queue name until it took want jobs in all, or the deadline; the
// moves themselves go on in the background.
func (b *bundle) moveUntil(name string, want int, deadline time.Duration) int {
	b.t.Helper()
	moved := 0
	end := time.Now().Add(deadline)
	for moved < want && time.Now().Before(end) {
		n, err := b.q.MoveDue(b.ctx, name, 16, 200*time.Millisecond, nil)
		if err != nil {
			b.t.Fatal(err)
		}
		moved += n
	}
	return moved
}

// A scheduled job waits in the schedule stream, shows as scheduled, is counted apart from
// the queue's depth, and reaches the workers with its body and envelope, never before its time.
func TestScheduledJobMovedAtItsTime(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q"})
	nb := time.Now().Add(1500 * time.Millisecond)
	r := b.publish(&queue.Job{Queue: "q", Direct: true, Body: []byte("later"), NotBefore: nb})
	st, err := b.q.Status(b.ctx, r.ID)
	if err != nil || st.State != queue.StateScheduled || st.NotBefore == nil || !st.NotBefore.Equal(nb) {
		t.Fatalf("status of a scheduled job: %+v, %v", st, err)
	}
	info, err := b.q.Info(b.ctx, "q")
	if err != nil || info.Scheduled != 1 || info.Depth != 0 {
		t.Fatalf("info: scheduled %d depth %d, %v; want 1 and 0", info.Scheduled, info.Depth, err)
	}
	c := b.consumer("q")
	if msgs, _ := c.Fetch(b.ctx, 1, 0); len(msgs) != 0 {
		t.Fatalf("a scheduled job reached the workers at once")
	}
	if n := b.moveUntil("q", 1, 10*time.Second); n != 1 {
		t.Fatalf("took %d due jobs, want 1", n)
	}
	m := b.fetchOne(c, 5*time.Second)
	if now := time.Now(); now.Before(nb) {
		t.Fatalf("moved %v before its time", nb.Sub(now))
	}
	if m.Job.ID != r.ID || string(m.Job.Body) != "later" || !m.Job.NotBefore.Equal(nb) {
		t.Fatalf("moved job: %+v", m.Job)
	}
	if st, _ := b.q.Status(b.ctx, r.ID); st.State != queue.StateQueued {
		t.Fatalf("state after its time: %s, want queued", st.State)
	}
	// The mover acks the due job once the queue stored it, so the job may reach the
	// consumer a moment before it leaves the schedule stream.
	testenv.WaitFor(t, 5*time.Second, "the schedule stream empty after the move", func() bool {
		info, err := b.q.Info(b.ctx, "q")
		return err == nil && info.Scheduled == 0
	})
}

// Cancel removes a job's schedule: it is never moved, and shows canceled.
func TestCancelScheduledJob(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q"})
	r := b.publish(&queue.Job{Queue: "q", Direct: true, NotBefore: time.Now().Add(time.Second)})
	keep := b.publish(&queue.Job{Queue: "q", Direct: true, NotBefore: time.Now().Add(time.Second)})
	if st, err := b.q.Cancel(b.ctx, r.ID); err != nil || st.State != queue.StateCanceled {
		t.Fatalf("cancel: %+v, %v", st, err)
	}
	if info, _ := b.q.Info(b.ctx, "q"); info.Scheduled != 1 {
		t.Fatalf("scheduled after a cancel: %d, want 1", info.Scheduled)
	}
	// The job kept is moved; once it is, the canceled one's schedule would have fired too.
	if n := b.moveUntil("q", 1, 10*time.Second); n != 1 {
		t.Fatalf("moved %d", n)
	}
	if n, err := b.q.MoveDue(b.ctx, "q", 16, 1500*time.Millisecond, nil); n != 0 || err != nil {
		t.Fatalf("moved %d more (%v): the canceled job", n, err)
	}
	if m := b.fetchOne(b.consumer("q"), 5*time.Second); m.Job.ID != keep.ID {
		t.Fatalf("got %s, want %s", m.Job.ID, keep.ID)
	}
	if st, _ := b.q.Status(b.ctx, r.ID); st.State != queue.StateCanceled {
		t.Fatalf("state: %s", st.State)
	}
}

// Scheduled jobs count against max_depth with the waiting ones.
func TestScheduledJobsCountInMaxDepth(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q", MaxDepth: 2})
	b.publish(&queue.Job{Queue: "q"})
	b.publish(&queue.Job{Queue: "q", NotBefore: time.Now().Add(time.Hour)})
	_, err := b.q.Publish(b.ctx, &queue.Job{Queue: "q", NotBefore: time.Now().Add(time.Hour)})
	wantErr(t, err, queue.ErrFull)
}

// A fair queue's scheduled job goes to its tenant's backlog when due.
func TestScheduledJobOfFairQueue(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "f", Fair: true})
	r := b.publish(&queue.Job{Queue: "f", Tenant: "t1", NotBefore: time.Now().Add(500 * time.Millisecond)})
	if n := b.moveUntil("f", 1, 10*time.Second); n != 1 {
		t.Fatalf("took %d", n)
	}
	testenv.WaitFor(t, 5*time.Second, "the job in its tenant's backlog", func() bool {
		bl, err := b.q.Backlog(b.ctx, "f")
		return err == nil && bl.Tenants["t1"] == 1
	})
	if st, err := b.q.Status(b.ctx, r.ID); err != nil || st.State != queue.StateQueued {
		t.Fatalf("status after the move: %+v, %v", st, err)
	}
}

// A queue's schedule stream is made by its first scheduled publish, not by Provision: until
// then the queue counts 0 scheduled and max_depth counts its waiting jobs alone. A watcher
// that started before is told of it at once.
func TestScheduleStreamOnDemand(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q", MaxDepth: 2}, queue.Spec{Name: "never"})
	b.noStream("_S_q")
	if info, err := b.q.Info(b.ctx, "q"); err != nil || info.Scheduled != 0 {
		t.Fatalf("info without a schedule stream: %+v, %v", info, err)
	}
	b.publish(&queue.Job{Queue: "q"})

	told := make(chan string, 4)
	wctx, stop := context.WithCancel(b.ctx)
	defer stop()
	watching := make(chan error, 1)
	go func() { watching <- b.q.WatchSchedules(wctx, func(name string) { told <- name }) }()
	// Whether the watch subscribes before or after the stream is made, it is told: by the
	// advisory, or by its listing (which follows its subscription).
	b.publish(&queue.Job{Queue: "q", NotBefore: time.Now().Add(time.Hour)})
	select {
	case name := <-told:
		if name != "q" {
			t.Fatalf("told of %q, want q", name)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the watcher was not told of the new schedule stream")
	}
	if info, err := b.q.Info(b.ctx, "q"); err != nil || info.Scheduled != 1 {
		t.Fatalf("info after a scheduled publish: %+v, %v", info, err)
	}
	_, err := b.q.Publish(b.ctx, &queue.Job{Queue: "q", NotBefore: time.Now().Add(time.Hour)})
	wantErr(t, err, queue.ErrFull)
	stop()
	if err := <-watching; err != nil {
		t.Fatalf("watch: %v", err)
	}
	b.noStream("_S_never")
}

// Another process finds an existing schedule stream by listing, and its Provision updates
// what changed in it and its mover.
func TestScheduleStreamListedAndUpdated(t *testing.T) {
	b := setup(t, queue.Options{}, queue.Spec{Name: "q"}, queue.Spec{Name: "never"})
	b.publish(&queue.Job{Queue: "q", NotBefore: time.Now().Add(time.Hour)})
	other := setupURL(t, b.url, b.opts, queue.Spec{Name: "q", StreamDuplicates: 3 * time.Minute, MaxAckPending: 7},
		queue.Spec{Name: "never"})
	listed := make(chan string, 4)
	lctx, lstop := context.WithTimeout(b.ctx, 5*time.Second)
	defer lstop()
	go func() { _ = other.q.WatchSchedules(lctx, func(name string) { listed <- name; lstop() }) }()
	<-lctx.Done()
	if n := len(listed); n != 1 {
		t.Fatalf("listed %d schedule streams, want 1", n)
	}
	if name := <-listed; name != "q" {
		t.Fatalf("listed %q, want q", name)
	}
	st, err := b.js.Stream(b.ctx, b.prefix+"_S_q")
	if err != nil || st.CachedInfo().Config.Duplicates != 3*time.Minute {
		t.Fatalf("schedule stream after a changed Provision: %v (%+v)", err, st)
	}
	c, err := b.js.Consumer(b.ctx, b.prefix+"_S_q", "mover")
	if err != nil || c.CachedInfo().Config.MaxAckPending != 7 {
		t.Fatalf("mover after a changed Provision: %v", err)
	}
	b.noStream("_S_never")
}

// In a three-node cluster the advisory of a new mover comes from its leader, whichever node
// the watcher is connected to: a watcher is told of a schedule stream made after it started
// (the second one here, made once the watcher was told of the first, so after its listing).
func TestScheduleStreamOnDemandInACluster(t *testing.T) {
	ns := testenv.NATSCluster(t)
	specs := []queue.Spec{{Name: "p", Replicas: 3}, {Name: "q", Replicas: 3}}
	b := setupURL(t, ns.URL, queue.Options{Replicas: 3}, specs...)
	watcher := setupURL(t, ns.URL, b.opts, specs...)
	told := make(chan string, 4)
	wctx, stop := context.WithCancel(b.ctx)
	defer stop()
	go func() { _ = watcher.q.WatchSchedules(wctx, func(name string) { told <- name }) }()
	for _, name := range []string{"p", "q"} {
		b.publish(&queue.Job{Queue: name, NotBefore: time.Now().Add(time.Hour)})
		for got := ""; got != name; { // p may be told twice: listed and advertised
			select {
			case got = <-told:
				if got != name && got != "p" {
					t.Fatalf("told of %q, want %q", got, name)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("the watcher was not told of %q's new schedule stream", name)
			}
		}
	}
	if info, err := b.q.Info(b.ctx, "q"); err != nil || info.Scheduled != 1 {
		t.Fatalf("info: %+v, %v", info, err)
	}
}
