package inflight

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// Benchmarks of a place's whole life, Acquire then Release. Run them with
//
//	SLUICE_STRICT=1 go test -run '^$' -bench . -benchmem ./inflight/
//
// The Redis benchmarks report round-trips/op, the commands the client sent per Acquire+Release
// (a pipeline counts once): a place costs two, one to take it and one to give it back; through
// a Reuser, two per place per second it serves.

func BenchmarkAcquireRelease(b *testing.B) {
	ctx := context.Background()
	run := func(b *testing.B, s Store, trips *atomic.Int64) {
		b.Run("one-key", func(b *testing.B) {
			caps := []Cap{{Key: "{b}:one", Limit: 1 << 30}}
			bench(b, ctx, s, func(int) []Cap { return caps }, trips, false)
		})
		b.Run("one-key/parallel", func(b *testing.B) {
			caps := []Cap{{Key: "{b}:par", Limit: 1 << 30}}
			bench(b, ctx, s, func(int) []Cap { return caps }, trips, true)
		})
		b.Run("two-caps", func(b *testing.B) {
			caps := []Cap{{Key: "{b}:queue", Limit: 1 << 30}, {Key: "{b}:tenant", Limit: 1 << 30}}
			bench(b, ctx, s, func(int) []Cap { return caps }, trips, false)
		})
		b.Run("1k-keys/parallel", func(b *testing.B) {
			caps := make([][]Cap, 1000)
			for i := range caps {
				caps[i] = []Cap{{Key: "{b" + strconv.Itoa(i) + "}", Limit: 4}}
			}
			bench(b, ctx, s, func(i int) []Cap { return caps[i%len(caps)] }, trips, true)
		})
	}
	b.Run("memory", func(b *testing.B) { run(b, NewMemory(), nil) })
	b.Run("redis", func(b *testing.B) {
		srv := testenv.Redis(b)
		rdb := srv.NewClient()
		trips := &roundTrips{}
		rdb.AddHook(trips)
		run(b, NewRedis(rdb, WithPrefix(testenv.Prefix(b))), &trips.n)
	})
	// A Reuser over Redis, as a worker holds its places: a place released under a cap with
	// room serves the next Acquire of the same caps without a round trip.
	b.Run("redis-reuse", func(b *testing.B) {
		srv := testenv.Redis(b)
		rdb := srv.NewClient()
		trips := &roundTrips{}
		rdb.AddHook(trips)
		r := Reuse(NewRedis(rdb, WithPrefix(testenv.Prefix(b))), 0, 0)
		b.Cleanup(func() { r.Close(context.Background()) })
		run(b, r, &trips.n)
	})
}

func bench(b *testing.B, ctx context.Context, s Store, caps func(int) []Cap, trips *atomic.Int64, parallel bool) {
	once := func(i int) {
		r, err := s.Acquire(ctx, caps(i), time.Minute)
		if err != nil || !r.Acquired {
			b.Errorf("Acquire: %+v, %v", r, err)
			return
		}
		if err := s.Release(ctx, r.Lease); err != nil {
			b.Error(err)
		}
	}
	once(0) // the server learns the scripts
	if trips != nil {
		trips.Store(0)
	}
	b.ReportAllocs()
	b.ResetTimer()
	if parallel {
		var seq atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				once(int(seq.Add(1)))
			}
		})
	} else {
		for i := 0; b.Loop(); i++ {
			once(i)
		}
	}
	if trips != nil {
		b.ReportMetric(float64(trips.Load())/float64(b.N), "round-trips/op")
	}
}

// roundTrips counts the commands and pipelines a go-redis client sends.
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// BenchmarkWaitContended: 256 Waits in a loop (take a place, give it back) on one cap of 8,
// half of them in each of two Redis stores, as jobs of two worker processes waiting for a
// queue's places. It reports round-trips/op: the attempts a place costs beside its own
// take and give-back, which a release that wakes every waiter multiplies.
func BenchmarkWaitContended(b *testing.B) {
	ctx := context.Background()
	srv := testenv.Redis(b)
	prefix := testenv.Prefix(b)
	trips := &roundTrips{}
	var stores []*Redis
	for range 2 {
		rdb := srv.NewClient()
		rdb.AddHook(trips)
		s := NewRedis(rdb, WithPrefix(prefix))
		b.Cleanup(func() { s.Close() })
		stores = append(stores, s)
	}
	caps := []Cap{{Key: "{b}:contended", Limit: 8}}
	var left atomic.Int64
	left.Store(int64(b.N))
	trips.n.Store(0)
	b.ResetTimer()
	done := make(chan struct{})
	for i := range 256 {
		go func() {
			defer func() { done <- struct{}{} }()
			s := stores[i%2]
			for left.Add(-1) >= 0 {
				r, err := s.Wait(ctx, caps, time.Minute)
				if err != nil {
					b.Error(err)
					return
				}
				if err := s.Release(ctx, r.Lease); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	for range 256 {
		<-done
	}
	b.ReportMetric(float64(trips.n.Load())/float64(b.N), "round-trips/op")
}
