package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// bundle is what one test works with: a server, a connection and a provisioned Queues whose
// names are unique to the test.
type bundle struct {
	t      testing.TB
	ctx    context.Context
	url    string
	nc     *nats.Conn
	js     jetstream.JetStream
	q      *queue.Queues
	prefix string
	opts   queue.Options // as given to New, with the prefix set
}

// setup starts an embedded NATS server and provisions specs under a prefix of the test's own.
func setup(t testing.TB, opts queue.Options, specs ...queue.Spec) *bundle {
	t.Helper()
	return setupURL(t, testenv.NATS(t).URL, opts, specs...)
}

func setupURL(t testing.TB, url string, opts queue.Options, specs ...queue.Spec) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	nc := testenv.Connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Prefix == "" {
		opts.Prefix = testenv.Name(t)
	}
	q, err := queue.New(ctx, js, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // stop withdrawing failed publishes before the server goes
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		q.Close(ctx)
	})
	if err := q.Provision(ctx, specs); err != nil {
		t.Fatal(err)
	}
	return &bundle{t: t, ctx: ctx, url: url, nc: nc, js: js, q: q, prefix: opts.Prefix, opts: opts}
}

func (b *bundle) stream(name string) string { return b.prefix + "_Q_" + name }

// noStream fails the test unless the stream named the prefix and suffix does not exist.
func (b *bundle) noStream(suffix string) {
	b.t.Helper()
	if _, err := b.js.Stream(b.ctx, b.prefix+suffix); !errors.Is(err, jetstream.ErrStreamNotFound) {
		b.t.Fatalf("stream %s%s: %v, want none", b.prefix, suffix, err)
	}
}
func (b *bundle) subject(name string) string { return b.prefix + ".q." + name }

// depth returns the number of messages in queue name's stream.
func (b *bundle) depth(name string) uint64 {
	b.t.Helper()
	st, err := b.js.Stream(b.ctx, b.stream(name))
	if err != nil {
		b.t.Fatal(err)
	}
	info, err := st.Info(b.ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	return info.State.Msgs
}

// stored reports whether job id's message is in queue name's stream.
func (b *bundle) stored(name, id string) bool {
	b.t.Helper()
	st, err := b.js.Stream(b.ctx, b.stream(name))
	if err != nil {
		b.t.Fatal(err)
	}
	_, err = st.GetLastMsgForSubject(b.ctx, b.subject(name)+"."+id)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false
	}
	if err != nil {
		b.t.Fatal(err)
	}
	return true
}

// publish publishes a job and fails the test on error.
func (b *bundle) publish(job *queue.Job) queue.Receipt {
	b.t.Helper()
	r, err := b.q.Publish(b.ctx, job)
	if err != nil {
		b.t.Fatalf("publish: %v", err)
	}
	return r
}

// fetchOne fetches exactly one job, waiting up to wait.
func (b *bundle) fetchOne(c *queue.Consumer, wait time.Duration) *queue.Msg {
	b.t.Helper()
	msgs, err := c.Fetch(b.ctx, 1, wait)
	if err != nil {
		b.t.Fatalf("fetch: %v", err)
	}
	if len(msgs) != 1 {
		b.t.Fatalf("fetch: got %d jobs, want 1", len(msgs))
	}
	return msgs[0]
}

func (b *bundle) consumer(name string) *queue.Consumer {
	b.t.Helper()
	c, err := b.q.Consumer(b.ctx, name)
	if err != nil {
		b.t.Fatal(err)
	}
	return c
}

// drain consumes and acks every job of queue name, returning the ids seen.
func (b *bundle) drain(name string) map[string]int {
	b.t.Helper()
	c := b.consumer(name)
	seen := map[string]int{}
	for b.depth(name) > 0 {
		msgs, err := c.Fetch(b.ctx, 256, time.Second)
		if err != nil {
			b.t.Fatalf("drain: %v", err)
		}
		for _, m := range msgs {
			seen[m.Job.ID]++
			if err := m.Ack(b.ctx); err != nil {
				b.t.Fatalf("drain: ack: %v", err)
			}
		}
	}
	return seen
}

func wantErr(t testing.TB, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("got error %v, want %v", err, target)
	}
}
