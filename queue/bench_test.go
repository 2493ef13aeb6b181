package queue_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/queue"
)

// Concurrent publishing, as the ingress does: every call waits for its own PubAck. Compare
// Publish (a PubAck plus the status write) with the raw JetStream calls in the same run:
//
//	go test -run '^$' -bench Publish -benchtime 2s ./queue/
func BenchmarkPublish(b *testing.B) {
	body := make([]byte, 512)
	for _, keyed := range []bool{false, true} {
		b.Run(fmt.Sprintf("queue/keyed=%v", keyed), func(b *testing.B) {
			e := setup(b, queue.Options{}, queue.Spec{Name: "bench"})
			var n atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					job := &queue.Job{Queue: "bench", Body: body}
					if keyed {
						job.IdempotencyKey = fmt.Sprint(n.Add(1))
					}
					if _, err := e.q.Publish(e.ctx, job); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
	// Baselines: a bare stream, one message per call, no status write.
	raw := func(b *testing.B, async bool) {
		e := setup(b, queue.Options{})
		subj := e.prefix + ".raw"
		if _, err := e.js.CreateStream(e.ctx, jetstream.StreamConfig{Name: e.prefix + "_RAW", Subjects: []string{subj},
			Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage}); err != nil {
			b.Fatal(err)
		}
		var n atomic.Int64
		b.ReportAllocs()
		b.SetParallelism(16)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				id := jetstream.WithMsgID(fmt.Sprint(n.Add(1)))
				if !async {
					if _, err := e.js.Publish(e.ctx, subj, body, id); err != nil {
						b.Error(err)
						return
					}
					continue
				}
				f, err := e.js.PublishAsync(subj, body, id)
				if err != nil {
					b.Error(err)
					return
				}
				select {
				case <-f.Ok():
				case err := <-f.Err():
					b.Error(err)
					return
				}
			}
		})
	}
	b.Run("raw/js.Publish", func(b *testing.B) { raw(b, false) })
	b.Run("raw/js.PublishAsync", func(b *testing.B) { raw(b, true) })
	// Pipelined async publishing from one goroutine: the ceiling, not the ingress's pattern.
	b.Run("raw/js.PublishAsync-pipelined", func(b *testing.B) {
		e := setup(b, queue.Options{})
		subj := e.prefix + ".raw"
		if _, err := e.js.CreateStream(e.ctx, jetstream.StreamConfig{Name: e.prefix + "_RAW", Subjects: []string{subj},
			Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage}); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if _, err := e.js.PublishAsync(subj, body, jetstream.WithMsgID(fmt.Sprint(i))); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-e.js.PublishAsyncComplete():
		case <-e.ctx.Done():
			b.Fatal("async publishes did not complete")
		}
	})
}
