package main

import (
	"errors"
	"fmt"
	"hash/fnv"
	"path/filepath"
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
// rate+1 in any second across both streams, and the own stream is then retired. Then another
// count, which puts the queue in another shared stream: the jobs waiting in the first are
// delivered, each once, and its consumer there deleted. The reverse: jobs waiting in the
// shared stream when the workers start again without shared streams are delivered, each
// once, and the queue's consumer on the shared stream is deleted.
func TestSharedMigrationProcesses(t *testing.T) {
	const rate = 50
	c := newCluster(t)
	c.ownStreams()
	queues := c.queueYAML("mig", fmt.Sprintf("%d/s", rate))
	ownPath := c.config(queues)
	waiting := workertest.Publish(t, c.qs, "mig", 30, true)

	js, err := jetstream.New(testenv.Connect(t, c.nats.URL))
	if err != nil {
		t.Fatal(err)
	}
	sharedPath, sq := c.sharedConfig(js, queues, 4)
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

	// Another count, under which the queue is in another shared stream.
	other := 2
	for slot(other) == slot(4) {
		other++
	}
	moved := workertest.Publish(t, sq, "mig", 10, true)
	otherPath, oq := c.sharedConfig(js, queues, other)
	procs = []*proc{spawn(t, otherPath), spawn(t, otherPath)}
	for _, p := range procs {
		p.waitReady()
	}
	posted = workertest.Publish(t, oq, "mig", 5, true)
	want += len(moved) + len(posted)
	c.up.WaitCount(t, 20*time.Second, "every job delivered", func(int) bool { return c.up.Distinct() >= want })
	if n := c.up.Count(); n != want {
		t.Errorf("%d deliveries of %d jobs", n, want)
	}
	testenv.WaitFor(t, 10*time.Second, "the queue's consumer on its former shared stream to be deleted", func() bool {
		_, err := js.Consumer(c.ctx, fmt.Sprintf("SLUICE_J_%d", slot(4)), "mig")
		return errors.Is(err, jetstream.ErrConsumerNotFound)
	})
	for _, p := range procs {
		p.kill()
	}

	// Back to a stream of its own.
	left := workertest.Publish(t, oq, "mig", 20, true)
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

// sharedConfig writes a config file of queues with nats.shared_streams n and provisions it
// in a queue layer over js, which it returns with the file's path.
func (c *cluster) sharedConfig(js jetstream.JetStream, queues string, n int) (string, *queue.Queues) {
	c.t.Helper()
	path := filepath.Join(c.dir, fmt.Sprintf("shared%d.yaml", n))
	c.writeConfigShared(path, queues, n)
	cfg, err := config.Load(path)
	if err != nil || cfg.NATS.SharedStreams != n {
		c.t.Fatalf("config: %v", err)
	}
	q, err := queue.New(c.ctx, js, queue.Options{SharedStreams: n})
	if err != nil {
		c.t.Fatal(err)
	}
	if err := q.Provision(c.ctx, app.QueueSpecs(cfg)); err != nil || !q.Shared("mig") {
		c.t.Fatalf("provision with %d shared streams: %v", n, err)
	}
	return path, q
}

// slot is the shared stream of queue "mig" among n (queue's FNV-1a of the name).
func slot(n int) int { return sharedSlot("mig", n) }

// sharedSlot is the shared stream of queue name among n (queue's FNV-1a of the name).
func sharedSlot(name string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(name))
	return int(h.Sum32() % uint32(n))
}
