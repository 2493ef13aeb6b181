package leaky

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// A tiny interval keeps the schedule near "now", as a busy queue's is.
var benchRate = Rate{Interval: time.Microsecond}

func BenchmarkRedisTake(b *testing.B) {
	srv := testenv.Redis(b)
	s := NewRedis(srv.Client, RedisConfig{Prefix: testenv.Prefix(b)})
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(8) // 8 × GOMAXPROCS goroutines: many workers, each one round trip at a time
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Take(ctx, "q", benchRate); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "takes/s")
}

func BenchmarkMemoryTake(b *testing.B) {
	s := NewMemory(nil)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Take(ctx, "q", benchRate); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMemoryTakeParallel spreads takes over 16 queues, as a process draining several does.
func BenchmarkMemoryTakeParallel(b *testing.B) {
	s := NewMemory(nil)
	ctx := context.Background()
	var next atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		queue := "q" + strconv.Itoa(int(next.Add(1)%16))
		for pb.Next() {
			if _, err := s.Take(ctx, queue, benchRate); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
