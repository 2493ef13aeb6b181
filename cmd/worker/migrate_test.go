package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/app"
	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
	"github.com/sluice-rl/sluice/queue"
)

// TestSharedMigrationProcesses: jobs waiting in a queue's own stream when the workers start
// with nats.shared_streams on are delivered, each once, beside those posted after, at most
// rate+1 in any second across both streams, and the own stream is then retired. The reverse:
// jobs waiting in the shared stream when the workers start again without shared streams are
// delivered, each once, and the queue's consumer on the shared stream is deleted.
func TestSharedMigrationProcesses(t *testing.T) {
	const rate = 50
	c := newCluster(t)
	queues := c.queueYAML("mig", fmt.Sprintf("%d/s", rate))
	ownPath := c.config(queues)
	waiting := workertest.Publish(t, c.qs, "mig", 30, true)

	sharedPath := filepath.Join(c.dir, "shared.yaml")
	c.writeConfig(sharedPath, queues)
	b, err := os.ReadFile(sharedPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sharedPath, []byte(strings.Replace(string(b), "nats: { url: ", "nats: { shared_streams: 4, url: ", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(sharedPath)
	if err != nil || cfg.NATS.SharedStreams != 4 {
		t.Fatalf("config: %v", err)
	}
	js, err := jetstream.New(testenv.Connect(t, c.nats.URL))
	if err != nil {
		t.Fatal(err)
	}
	sq, err := queue.New(c.ctx, js, queue.Options{SharedStreams: 4})
	if err != nil {
		t.Fatal(err)
	}
	if err := sq.Provision(c.ctx, app.QueueSpecs(cfg)); err != nil || !sq.Shared("mig") {
		t.Fatalf("provision with shared streams: %v, shared %v", err, sq.Shared("mig"))
	}
	procs := []*proc{spawn(t, sharedPath), spawn(t, sharedPath)}
	for _, p := range procs {
		p.waitReady()
	}
	posted := workertest.Publish(t, sq, "mig", 10, true)
	want := len(waiting) + len(posted)
	c.up.WaitCount(t, 20*time.Second, "every job delivered", func(int) bool { return c.up.Distinct() >= want })
	if n := c.up.Count(); n != want {
		t.Errorf("%d deliveries of %d jobs", n, want)
	}
	if w := workertest.MaxWindow(workertest.Times(c.up.Arrivals()), time.Second); w > rate+1 {
		t.Errorf("a 1s window holds %d deliveries at %d/s", w, rate)
	}
	testenv.WaitFor(t, 10*time.Second, "the queue's own stream to be retired", func() bool {
		_, err := js.Stream(c.ctx, "SLUICE_Q_mig")
		return errors.Is(err, jetstream.ErrStreamNotFound)
	})
	for _, p := range procs {
		p.kill()
	}

	// Back to a stream of its own.
	left := workertest.Publish(t, sq, "mig", 20, true)
	c.config(queues) // the own stream made again, as the workers will
	procs = []*proc{spawn(t, ownPath), spawn(t, ownPath)}
	for _, p := range procs {
		p.waitReady()
	}
	own := workertest.Publish(t, c.qs, "mig", 5, true)
	want += len(left) + len(own)
	c.up.WaitCount(t, 20*time.Second, "every job delivered", func(int) bool { return c.up.Distinct() >= want })
	if n := c.up.Count(); n != want {
		t.Errorf("%d deliveries of %d jobs", n, want)
	}
	testenv.WaitFor(t, 10*time.Second, "the queue's consumer on the shared stream to be deleted", func() bool {
		l := js.ListStreams(c.ctx, jetstream.WithStreamListSubject("SLUICE.j.>"))
		n := 0
		for si := range l.Info() {
			n += si.State.Consumers
		}
		return l.Err() == nil && n == 0
	})
}
