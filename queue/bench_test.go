package queue_test

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/queue"
)

// cpuTime is the CPU time (user and system) this process has used so far.
func cpuTime() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// reportCPU reports the CPU time per op since start as cpu-µs/op: with the embedded server in
// the same process it is client and server together, the figure that decides throughput on a
// machine whose cores are all busy, and steadier than ns/op on a shared one.
func reportCPU(b *testing.B, start int64) {
	b.ReportMetric(float64(cpuTime()-start)/float64(b.N)/1e3, "cpu-µs/op")
}

// Concurrent publishing, as the ingress does: every call waits for its own PubAck. Compare
// Publish (unkeyed: one message; keyed: a status read, the message, the status entry) with the
// raw JetStream calls in the same run:
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
			start := cpuTime()
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
			reportCPU(b, start)
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
		start := cpuTime()
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
		reportCPU(b, start)
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
		start := cpuTime()
		// Past 4000 outstanding publishes PublishAsync waits for acks; on a loaded machine the
		// default 200ms of that wait is not always enough.
		stall := jetstream.WithStallWait(30 * time.Second)
		for i := range b.N {
			if _, err := e.js.PublishAsync(subj, body, jetstream.WithMsgID(fmt.Sprint(i)), stall); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-e.js.PublishAsyncComplete():
		case <-e.ctx.Done():
			b.Fatal("async publishes did not complete")
		}
		reportCPU(b, start)
	})
}
