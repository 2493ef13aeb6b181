package limit

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// Tests every store must pass beyond the step tables: bad input and concurrent use.

// stores returns the stores under test, each fresh and empty, on the real clock.
func stores(t *testing.T) map[string]Limiter {
	srv := testenv.Redis(t)
	return map[string]Limiter{
		"memory":          NewMemory(MemoryConfig{}),
		"redis":           NewRedis(srv.Client, RedisConfig{Prefix: testenv.Prefix(t)}),
		"redis-unbatched": NewRedis(srv.Client, RedisConfig{Prefix: testenv.Prefix(t), MaxBatch: -1}),
	}
}

func TestBadInput(t *testing.T) {
	good := Limit{Algorithm: FixedWindow, Limit: 2, Period: time.Hour}
	tests := []struct {
		name string
		key  string
		l    Limit
		cost int64
		want error
	}{
		{"zero limit", "k", Limit{Algorithm: TokenBucket, Limit: 0, Period: time.Second}, 1, ErrInvalidLimit},
		{"negative limit", "k", Limit{Algorithm: GCRA, Limit: -3, Period: time.Second}, 1, ErrInvalidLimit},
		{"zero period", "k", Limit{Algorithm: FixedWindow, Limit: 1}, 1, ErrInvalidPeriod},
		{"negative period", "k", Limit{Algorithm: SlidingLog, Limit: 1, Period: -time.Second}, 1, ErrInvalidPeriod},
		{"negative burst", "k", Limit{Algorithm: TokenBucket, Limit: 1, Period: time.Second, Burst: -1}, 1, ErrInvalidBurst},
		{"no algorithm", "k", Limit{Limit: 1, Period: time.Second}, 1, ErrUnknownAlgorithm},
		{"unknown algorithm", "k", Limit{Algorithm: "token-bucket", Limit: 1, Period: time.Second}, 1, ErrUnknownAlgorithm},
		{"zero cost", "k", good, 0, ErrInvalidCost},
		{"negative cost", "k", good, -1, ErrInvalidCost},
		{"cost above the window", "k", good, 3, ErrCostTooHigh},
		{"cost above the bucket", "k", Limit{Algorithm: LeakyBucket, Limit: 100, Period: time.Second}, 2, ErrCostTooHigh},
		{"cost above the burst", "k", Limit{Algorithm: TokenBucket, Limit: 100, Period: time.Second, Burst: 5}, 6, ErrCostTooHigh},
		{"empty key", "", good, 1, ErrEmptyKey},
		{"key too long", strings.Repeat("x", MaxKeyLen+1), good, 1, ErrKeyTooLong},
		{"absurdly long key", strings.Repeat("x", 1<<20), good, 1, ErrKeyTooLong},
		{"sub-microsecond period", "k", Limit{Algorithm: GCRA, Limit: 1, Period: time.Nanosecond}, 1, ErrOutOfRange},
		{"huge sliding log", "k", Limit{Algorithm: SlidingLog, Limit: 1 << 20, Period: time.Second}, 1, ErrOutOfRange},
	}
	ctx := context.Background()
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			for i, tt := range tests {
				if _, err := s.Decide(ctx, tt.key, tt.l, tt.cost); !errors.Is(err, tt.want) {
					t.Errorf("%s: Decide error %v, want %v", tt.name, err, tt.want)
				}
				// In DecideAll, one bad request fails the call and nothing is charged.
				okKey := "ok-" + string(rune('a'+i))
				reqs := []Request{{Key: okKey, Limit: good, Cost: 1}, {Key: tt.key, Limit: tt.l, Cost: tt.cost}}
				if ds, err := s.DecideAll(ctx, reqs); !errors.Is(err, tt.want) || ds != nil {
					t.Errorf("%s: DecideAll = %v, %v, want nil, %v", tt.name, ds, err, tt.want)
				}
				d, err := s.Decide(ctx, okKey, good, 2)
				if err != nil || !d.Allowed {
					t.Errorf("%s: the valid request of a failed DecideAll was charged: %s, %v", tt.name, show(d), err)
				}
			}
			if ds, err := s.DecideAll(ctx, nil); err != nil || len(ds) != 0 {
				t.Errorf("DecideAll(nil) = %v, %v", ds, err)
			}

			admitted, err := s.Decide(ctx, "adjust", good, 2)
			if err != nil || !admitted.Allowed {
				t.Fatalf("Decide: %s, %v", show(admitted), err)
			}
			rejected, err := s.Decide(ctx, "adjust", good, 1)
			if err != nil || rejected.Allowed {
				t.Fatalf("Decide: %s, %v", show(rejected), err)
			}
			for _, tt := range []struct {
				name string
				key  string
				l    Limit
				d    Decision
				used int64
				want error
			}{
				{"a rejected decision", "adjust", good, rejected, 0, ErrNotAdmitted},
				{"a zero decision", "adjust", good, Decision{}, 0, ErrNotAdmitted},
				{"negative use", "adjust", good, admitted, -1, ErrInvalidCost},
				{"empty key", "", good, admitted, 0, ErrEmptyKey},
				{"bad limit", "adjust", Limit{Algorithm: FixedWindow, Period: time.Hour}, admitted, 0, ErrInvalidLimit},
			} {
				if err := s.Adjust(ctx, tt.key, tt.l, tt.d, tt.used); !errors.Is(err, tt.want) {
					t.Errorf("Adjust, %s: error %v, want %v", tt.name, err, tt.want)
				}
			}
			// None of them refunded anything: the window is still full.
			if d, err := s.Decide(ctx, "adjust", good, 1); err != nil || d.Allowed {
				t.Errorf("after bad adjustments: %s, %v; want a rejection", show(d), err)
			}
		})
	}
}

// TestConcurrentCallersAdmitExactlyTheLimit hammers one key from many goroutines (for Redis:
// through two separate clients, as two replicas would, with and without coalescing into shared
// pipelines) under limits that cannot refill during the test, and counts the admitted requests:
// exactly the limit, never more, never fewer.
func TestConcurrentCallersAdmitExactlyTheLimit(t *testing.T) {
	const limit, goroutines, tries = 100, 64, 4
	limits := []Limit{
		{Algorithm: TokenBucket, Limit: limit, Period: 1000 * time.Hour},
		{Algorithm: GCRA, Limit: limit, Period: 1000 * time.Hour},
		{Algorithm: LeakyBucket, Limit: limit, Period: 1000 * time.Hour, Burst: limit},
		{Algorithm: FixedWindow, Limit: limit, Period: 10000 * time.Hour},
		{Algorithm: SlidingLog, Limit: limit, Period: 1000 * time.Hour},
		{Algorithm: SlidingWindow, Limit: limit, Period: 1000 * time.Hour},
	}
	srv := testenv.Redis(t)
	ctx := context.Background()
	for _, l := range limits {
		t.Run(string(l.Algorithm), func(t *testing.T) {
			prefix := testenv.Prefix(t)
			mem := NewMemory(MemoryConfig{})
			for name, clients := range map[string][]Limiter{
				"memory": {mem, mem},
				"redis": {
					NewRedis(srv.NewClient(), RedisConfig{Prefix: prefix}),
					NewRedis(srv.NewClient(), RedisConfig{Prefix: prefix}),
				},
				"redis-unbatched": {
					NewRedis(srv.NewClient(), RedisConfig{Prefix: prefix + "u:", MaxBatch: -1}),
					NewRedis(srv.NewClient(), RedisConfig{Prefix: prefix + "u:", MaxBatch: -1}),
				},
			} {
				var admitted, rejected atomic.Int64
				var wg sync.WaitGroup
				start := make(chan struct{})
				errs := make(chan error, 2*goroutines)
				for _, c := range clients {
					for range goroutines {
						wg.Add(1)
						go func() {
							defer wg.Done()
							<-start
							for i := range tries {
								var d Decision
								var err error
								if i%2 == 0 {
									d, err = c.Decide(ctx, "hot", l, 1)
								} else {
									var ds []Decision
									ds, err = c.DecideAll(ctx, []Request{{Key: "hot", Limit: l, Cost: 1}})
									if err == nil {
										d = ds[0]
									}
								}
								if err != nil {
									errs <- err
									return
								}
								if d.Allowed {
									admitted.Add(1)
								} else {
									rejected.Add(1)
								}
							}
						}()
					}
				}
				close(start)
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatalf("%s: %v", name, err)
				}
				if admitted.Load() != limit || admitted.Load()+rejected.Load() != 2*goroutines*tries {
					t.Errorf("%s: admitted %d and rejected %d of %d requests, want %d admitted",
						name, admitted.Load(), rejected.Load(), 2*goroutines*tries, limit)
				}
			}
		})
	}
}
