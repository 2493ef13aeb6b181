package limit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// Benchmarks. Run them with
//
//	SLUICE_STRICT=1 go test -run '^$' -bench . -benchmem ./limit/
//
// The references run in the same invocation, on the same machine, so the ratios mean something
// even on a noisy one: golang.org/x/time/rate for the memory store, a raw EVALSHA of the same
// script and github.com/go-redis/redis_rate for the Redis store.

// benchLimit is a limit of algorithm a that admits everything a benchmark sends it, so that
// benchmarks measure the admitting path.
func benchLimit(a Algorithm) Limit {
	if a == SlidingLog {
		return Limit{Algorithm: a, Limit: MaxLogLimit, Period: time.Millisecond}
	}
	return Limit{Algorithm: a, Limit: 1 << 30, Period: time.Millisecond}
}

func BenchmarkMemory(b *testing.B) {
	ctx := context.Background()
	b.Run("x-time-rate/hot-key", func(b *testing.B) {
		lim := rate.NewLimiter(rate.Limit(1<<30), 1<<30)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				lim.Allow()
			}
		})
	})
	for _, a := range Algorithms {
		l := benchLimit(a)
		b.Run(string(a)+"/hot-key", func(b *testing.B) {
			m := NewMemory(MemoryConfig{})
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := m.Decide(ctx, "rule:hot", l, 1); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
	keys := benchKeys(1_000_000)
	for _, a := range Algorithms {
		// An hour, so that no key goes idle and is removed during the benchmark, and few
		// enough decisions per key that nearly all are admitted.
		l := Limit{Algorithm: a, Limit: 1000, Period: time.Hour}
		if a == SlidingLog {
			l.Limit = 10 // its log holds up to Limit entries per key
		}
		var m *Memory // filled once, shared by the runs of the sub-benchmark
		b.Run(string(a)+"/1M-keys", func(b *testing.B) {
			if m == nil {
				m = NewMemory(MemoryConfig{})
				for _, k := range keys {
					m.Decide(ctx, k, l, 1)
				}
				if n := m.Len(); n != len(keys) {
					b.Fatalf("%d keys held, want %d", n, len(keys))
				}
			}
			var seq atomic.Uint64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				// Each goroutine walks the keys in order from its own start: the keys' strings
				// are read in order, the store's entries (placed by hash) at random.
				i := int(seq.Add(1)) * len(keys) / 64
				for pb.Next() {
					if _, err := m.Decide(ctx, keys[i%len(keys)], l, 1); err != nil {
						b.Error(err)
						return
					}
					i++
				}
			})
		})
	}
}

// BenchmarkMemoryBytesPerKey measures the heap a million keys take, per key (metric B/key).
// One operation is inserting the million keys.
func BenchmarkMemoryBytesPerKey(b *testing.B) {
	ctx := context.Background()
	keys := benchKeys(1_000_000)
	for _, a := range Algorithms {
		l := Limit{Algorithm: a, Limit: 10, Period: time.Hour}
		b.Run(string(a), func(b *testing.B) {
			var perKey float64
			for range b.N {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				m := NewMemory(MemoryConfig{})
				for _, k := range keys {
					m.Decide(ctx, k, l, 1)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				if n := m.Len(); n != len(keys) {
					b.Fatalf("%d keys held, want %d", n, len(keys))
				}
				perKey = float64(after.HeapAlloc-before.HeapAlloc) / float64(len(keys))
				runtime.KeepAlive(m)
			}
			b.ReportMetric(perKey, "B/key")
		})
	}
}

var (
	benchKeysOnce sync.Once
	benchKeysList []string
)

// benchKeys returns n distinct keys shaped like the ingress's "rule:key".
func benchKeys(n int) []string {
	benchKeysOnce.Do(func() {
		benchKeysList = make([]string, 1_000_000)
		for i := range benchKeysList {
			benchKeysList[i] = "rule:user-" + strconv.Itoa(i)
		}
	})
	return benchKeysList[:n]
}

// BenchmarkRedis measures decisions per second through the Redis store with 64 concurrent
// callers, beside a raw EVALSHA of the same script with the same arguments (the floor: what
// the server and the client library cost) and redis_rate's GCRA.
func BenchmarkRedis(b *testing.B) {
	srv := testenv.Redis(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
	b.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	keys := benchKeys(10_000)
	parallelism := max(1, 64/runtime.GOMAXPROCS(0))
	run := func(b *testing.B, decide func(key string) error) {
		var seq atomic.Uint64
		b.ReportAllocs()
		b.SetParallelism(parallelism)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			rng := rand.New(rand.NewPCG(seq.Add(1), 1))
			for pb.Next() {
				if err := decide(keys[rng.IntN(len(keys))]); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	}
	for _, a := range Algorithms {
		l := Limit{Algorithm: a, Limit: 1000, Period: time.Second}
		b.Run(string(a)+"/store", func(b *testing.B) {
			r := NewRedis(rdb, RedisConfig{Prefix: "bench:"})
			run(b, func(key string) error {
				_, err := r.Decide(ctx, key, l, 1)
				return err
			})
		})
		b.Run(string(a)+"/raw-evalsha", func(b *testing.B) {
			r := NewRedis(rdb, RedisConfig{Prefix: "bench:"})
			p, err := l.validate()
			if err != nil {
				b.Fatal(err)
			}
			script := scripts[p.alg]
			if err := script.Load(ctx, rdb).Err(); err != nil {
				b.Fatal(err)
			}
			run(b, func(key string) error {
				k, args := r.call(key, Limit{}, p, 1, "")
				return rdb.EvalSha(ctx, script.Hash(), k, args...).Err()
			})
		})
	}
	b.Run("redis_rate-gcra", func(b *testing.B) {
		rl := redis_rate.NewLimiter(rdb)
		lim := redis_rate.PerSecond(1000)
		run(b, func(key string) error {
			_, err := rl.Allow(ctx, key, lim)
			return err
		})
	})
}

// BenchmarkRedisBytesPerKey measures what one key costs in Redis (metric B/key): MEMORY USAGE
// of the keys after one decision each (a sliding log after ten), and the growth of the
// server's used_memory per key, which also counts the expiry index.
func BenchmarkRedisBytesPerKey(b *testing.B) {
	srv := testenv.Redis(b)
	ctx := context.Background()
	const n = 10_000
	keys := benchKeys(n)
	usedMemory := func() float64 {
		info, err := srv.Client.Info(ctx, "memory").Result()
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				f, _ := strconv.ParseFloat(v, 64)
				return f
			}
		}
		b.Fatal("no used_memory in INFO memory")
		return 0
	}
	measure := func(b *testing.B, decide func(key string) error, key func(string) string) {
		var usage, used float64
		for range b.N {
			if err := srv.Client.FlushAll(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			before := usedMemory()
			for _, k := range keys {
				if err := decide(k); err != nil {
					b.Fatal(err)
				}
			}
			used = (usedMemory() - before) / n
			usage = 0
			for _, k := range keys[:1000] {
				u, err := srv.Client.MemoryUsage(ctx, key(k), 0).Result()
				if err != nil {
					b.Fatal(err)
				}
				usage += float64(u) / 1000
			}
		}
		b.ReportMetric(usage, "B/key")
		b.ReportMetric(used, "used_memory-B/key")
	}
	for _, a := range Algorithms {
		l := Limit{Algorithm: a, Limit: 10, Period: time.Hour}
		b.Run(string(a), func(b *testing.B) {
			r := NewRedis(srv.Client, RedisConfig{})
			p, _ := l.validate()
			decisions := 1
			if a == SlidingLog {
				decisions = 10
			}
			measure(b, func(key string) error {
				for range decisions {
					if _, err := r.Decide(ctx, key, l, 1); err != nil {
						return err
					}
				}
				return nil
			}, func(key string) string { return r.prefix + "{" + keyTags[p.alg] + ":" + key + "}" })
		})
	}
	b.Run("redis_rate-gcra", func(b *testing.B) {
		rl := redis_rate.NewLimiter(srv.Client)
		measure(b, func(key string) error {
			_, err := rl.Allow(ctx, key, redis_rate.PerHour(10))
			return err
		}, func(key string) string { return "rate:" + key })
	})
}

// BenchmarkSlidingWindowAccuracy compares the sliding window counter with the exact sliding
// log on a synthetic bursty trace (see burstyTrace). Metrics:
//
//   - %differ: requests the two decide differently when each runs on its own (their histories
//     drift apart once they first disagree, so this counts consequences too);
//   - %differ-same-history: requests where the counter's estimate, computed from the log's
//     history, leads to another decision than the log's exact count: the error of the
//     estimate alone;
//   - %more-admitted: how many more requests the counter admitted than the log, in percent;
//   - max-window/limit: the most the counter admitted in any trailing period, as a multiple of
//     the limit (the log never exceeds 1).
//
// One operation is the whole trace.
func BenchmarkSlidingWindowAccuracy(b *testing.B) {
	l := Limit{Algorithm: SlidingWindow, Limit: 100, Period: time.Minute}
	pw, _ := l.validate()
	l.Algorithm = SlidingLog
	pl, _ := l.validate()
	P, L := pw.period, pw.limit
	trace := burstyTrace(rand.New(rand.NewPCG(7, 8)), 200_000, P)
	var differ, differSame int
	var worst, more float64
	for range b.N {
		var sw slidingWindowState
		var sl slidingLogState
		var byCounter, byLog []int64 // admitted times
		differ, differSame, worst = 0, 0, 0
		lo, prevLo, curLo := 0, 0, 0 // byLog[lo:] is in the trailing period; windows likewise
		for _, t := range trace {
			now := time.UnixMicro(t)
			var dw Decision
			sw, dw = slidingWindow(sw, pw, 1, now)
			dl := slidingLog(&sl, pl, 1, now)
			if dw.Allowed != dl.Allowed {
				differ++
			}
			// The counter's estimate over the log's history.
			start := t - t%P
			for prevLo < len(byLog) && byLog[prevLo] < start-P {
				prevLo++
			}
			for curLo < len(byLog) && byLog[curLo] < start {
				curLo++
			}
			prev, cur := int64(curLo-prevLo), int64(len(byLog)-curLo)
			if (prev*(start+P-t)/P+cur+1 <= L) != dl.Allowed {
				differSame++
			}
			if dw.Allowed {
				byCounter = append(byCounter, t)
			}
			if dl.Allowed {
				byLog = append(byLog, t)
			}
		}
		for i, t := range byCounter {
			for byCounter[lo] <= t-P {
				lo++
			}
			worst = max(worst, float64(i-lo+1)/float64(L))
		}
		more = 100 * (float64(len(byCounter))/float64(len(byLog)) - 1)
	}
	b.ReportMetric(100*float64(differ)/float64(len(trace)), "%differ")
	b.ReportMetric(100*float64(differSame)/float64(len(trace)), "%differ-same-history")
	b.ReportMetric(more, "%more-admitted")
	b.ReportMetric(worst, "max-window/limit")
}

// burstyTrace returns n request times (µs, increasing) of one client under a limit of 100 per
// period, moving between phases: steady traffic at 20% to 90% of the limit for one to five
// periods (60% of phases), bursts at 1.5 to 5 times the limit for a tenth of a period to a
// whole one (25%), and silences of a tenth of a period to two (15%). Gaps between requests are
// exponential (a Poisson process within each phase).
func burstyTrace(rng *rand.Rand, n int, period int64) []int64 {
	out := make([]int64, 0, n)
	t := base.UnixMicro()
	span := func(lo, hi float64) int64 { return int64((lo + rng.Float64()*(hi-lo)) * float64(period)) }
	for len(out) < n {
		var rate float64 // requests per period
		var d int64
		switch x := rng.Float64(); {
		case x < 0.60:
			rate, d = 100*(0.2+0.7*rng.Float64()), span(1, 5)
		case x < 0.85:
			rate, d = 100*(1.5+3.5*rng.Float64()), span(0.1, 1)
		default:
			t += span(0.1, 2)
			continue
		}
		end := t + d
		for len(out) < n {
			t += 1 + int64(rng.ExpFloat64()*float64(period)/rate)
			if t >= end {
				break
			}
			out = append(out, t)
		}
	}
	return out
}

// interleave runs every variant for ops operations spread over goroutines, round after round,
// so that a load that comes and goes on a shared machine falls on all of them alike, and
// returns each variant's operations per second over all rounds. ops is the whole round's count.
func interleave(b *testing.B, rounds, ops, goroutines int, variants []func(i int) error) []float64 {
	spent := make([]time.Duration, len(variants))
	for range rounds {
		for v, run := range variants {
			var wg sync.WaitGroup
			start := time.Now()
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := g; i < ops; i += goroutines {
						if err := run(i); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			spent[v] += time.Since(start)
		}
	}
	rates := make([]float64, len(variants))
	for v := range variants {
		rates[v] = float64(rounds*ops) / spent[v].Seconds()
	}
	return rates
}

// BenchmarkInterleaved measures the ratios the other benchmarks only suggest on a shared
// machine: each store against its references, in alternating rounds. Metrics: for the memory
// store, ns per decision on one hot key from GOMAXPROCS goroutines and the ratio to
// x/time/rate's Allow ("x-rate"); for Redis, decisions/s with 64 callers and the ratios to a raw
// EVALSHA of the same script ("x-raw") and to redis_rate ("x-redis_rate", GCRA only).
func BenchmarkInterleaved(b *testing.B) {
	ctx := context.Background()
	b.Run("memory", func(b *testing.B) {
		lim := rate.NewLimiter(rate.Limit(1<<30), 1<<30)
		m := NewMemory(MemoryConfig{})
		variants := []func(int) error{func(int) error { lim.Allow(); return nil }}
		for _, a := range Algorithms {
			l := benchLimit(a)
			variants = append(variants, func(int) error {
				_, err := m.Decide(ctx, "rule:hot", l, 1)
				return err
			})
		}
		var rates []float64
		for range b.N {
			rates = interleave(b, 20, 200_000, runtime.GOMAXPROCS(0), variants)
		}
		b.ReportMetric(1e9/rates[0], "ns/x-time-rate")
		for i, a := range Algorithms {
			b.ReportMetric(1e9/rates[i+1], "ns/"+string(a))
			b.ReportMetric(rates[0]/rates[i+1], "x-rate/"+string(a))
		}
	})
	b.Run("redis", func(b *testing.B) {
		srv := testenv.Redis(b)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
		b.Cleanup(func() { rdb.Close() })
		keys := benchKeys(10_000)
		r := NewRedis(rdb, RedisConfig{Prefix: "bench:"})
		rl := redis_rate.NewLimiter(rdb)
		var variants []func(int) error
		for _, a := range Algorithms {
			l := Limit{Algorithm: a, Limit: 1000, Period: time.Second}
			p, err := l.validate()
			if err != nil {
				b.Fatal(err)
			}
			script := scripts[p.alg]
			if err := script.Load(ctx, rdb).Err(); err != nil {
				b.Fatal(err)
			}
			variants = append(variants,
				func(i int) error {
					_, err := r.Decide(ctx, keys[i%len(keys)], l, 1)
					return err
				},
				func(i int) error {
					k, args := r.call(keys[i%len(keys)], Limit{}, p, 1, "")
					return rdb.EvalSha(ctx, script.Hash(), k, args...).Err()
				})
		}
		variants = append(variants, func(i int) error {
			_, err := rl.Allow(ctx, keys[i%len(keys)], redis_rate.PerSecond(1000))
			return err
		})
		var rates []float64
		for range b.N {
			rates = interleave(b, 10, 4000, 64, variants)
		}
		for i, a := range Algorithms {
			store, raw := rates[2*i], rates[2*i+1]
			b.ReportMetric(store, "decisions/s/"+string(a))
			b.ReportMetric(raw, "evalsha/s/"+string(a))
			b.ReportMetric(store/raw, "x-raw/"+string(a))
		}
		rr := rates[len(rates)-1]
		b.ReportMetric(rr, "decisions/s/redis_rate")
		b.ReportMetric(rates[2*len(Algorithms)-2]/rr, "x-redis_rate/gcra")
	})
}

// BenchmarkRedisDecide measures what coalescing concurrent decisions into shared pipelines
// (RedisConfig.MaxBatch and Pipelines: the default 4, and 1 and 2 for comparison) buys, beside
// the store without it and two references: a raw EVALSHA of the same script, and the same
// EVALSHA through go-redis's own (experimental) AutoPipeliner. Every call carries a deadline,
// as the ingress's do.
//
// The "64-callers" sub-benchmarks are the usual kind, one variant after the other
// (b.SetParallelism for 64 goroutines): ns/op and allocs/op. On a shared machine their
// decisions/s are not comparable with each other; the "interleaved" ones are: for each number
// of concurrent callers, every variant runs in alternating rounds (see interleave), and the
// metrics are decisions/s and the ratio of each variant to the unbatched store ("x-unbatched").
// Two clients: go-redis's default pool (10 per GOMAXPROCS, as the ingress's) and a pool of 64.
func BenchmarkRedisDecide(b *testing.B) {
	srv := testenv.Redis(b)
	newClient := func(pool int) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: pool, ContextTimeoutEnabled: true})
		b.Cleanup(func() { c.Close() })
		return c
	}
	def, pool64 := newClient(0), newClient(64)
	ap, err := def.AutoPipeline()
	if err != nil {
		b.Fatal(err)
	}
	keys := benchKeys(10_000)
	l := Limit{Algorithm: TokenBucket, Limit: 1000, Period: time.Second}
	p, err := l.validate()
	if err != nil {
		b.Fatal(err)
	}
	script := scripts[p.alg]
	if err := script.Load(context.Background(), def).Err(); err != nil {
		b.Fatal(err)
	}
	prefix := testenv.Prefix(b)
	raw := NewRedis(def, RedisConfig{Prefix: prefix}) // for its call()
	decide := func(r *Redis) func(int) error {
		return func(i int) error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := r.Decide(ctx, keys[i%len(keys)], l, 1)
			return err
		}
	}
	evalSha := func(c interface {
		EvalSha(context.Context, string, []string, ...any) *redis.Cmd
	}) func(int) error {
		return func(i int) error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			k, args := raw.call(keys[i%len(keys)], Limit{}, p, 1, "")
			return c.EvalSha(ctx, script.Hash(), k, args...).Err()
		}
	}
	type variant struct {
		name string
		run  func(int) error
	}
	variants := []variant{
		{"unbatched", decide(NewRedis(def, RedisConfig{Prefix: prefix, MaxBatch: -1}))},
		// The same again: its ratio to the first shows how far the machine's noise alone
		// moves a ratio in this run.
		{"unbatched-again", decide(NewRedis(def, RedisConfig{Prefix: prefix, MaxBatch: -1}))},
		{"unbatched-pool64", decide(NewRedis(pool64, RedisConfig{Prefix: prefix, MaxBatch: -1}))},
		{"batched", decide(NewRedis(def, RedisConfig{Prefix: prefix}))}, // Pipelines 4
		{"batched-pipelines-1", decide(NewRedis(def, RedisConfig{Prefix: prefix, Pipelines: 1}))},
		{"batched-pipelines-2", decide(NewRedis(def, RedisConfig{Prefix: prefix, Pipelines: 2}))},
		{"raw-evalsha", evalSha(def)},
		{"raw-evalsha-pool64", evalSha(pool64)},
		{"go-redis-autopipeline", evalSha(ap)},
	}

	for _, v := range []variant{variants[0], variants[3], variants[6]} {
		b.Run("64-callers/"+v.name, func(b *testing.B) {
			var seq atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(1)) * 997
				for pb.Next() {
					if err := v.run(i); err != nil {
						b.Error(err)
						return
					}
					i++
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
		})
	}

	for _, callers := range []int{1, 2, 4, 8, 16, 64} {
		b.Run(fmt.Sprintf("interleaved/callers=%d", callers), func(b *testing.B) {
			runs := make([]func(int) error, len(variants))
			for i, v := range variants {
				runs[i] = v.run
			}
			ops := 1000 * min(callers, 8)
			var rates []float64
			for range b.N {
				rates = interleave(b, 10, ops, callers, runs)
			}
			for i, v := range variants {
				b.ReportMetric(rates[i], "decisions/s/"+v.name)
				b.ReportMetric(rates[i]/rates[0], "x-unbatched/"+v.name)
			}
		})
	}
}

// BenchmarkMemoryKeyFlood decides b.N distinct keys of one rule against a store of the default
// size that also holds an exhausted key of another rule, as an attacker flooding API keys would:
// run it with -benchtime 3000000x for a flood of a few million keys. It fails if the exhausted
// key is ever allowed again, and reports the share of flood decisions made on the overflow state.
func BenchmarkMemoryKeyFlood(b *testing.B) {
	ctx := context.Background()
	m := NewMemory(MemoryConfig{})
	victim := Limit{Algorithm: GCRA, Limit: 1, Period: time.Hour}
	m.Decide(ctx, "login\x00victim", victim, 1)
	flood := Limit{Algorithm: TokenBucket, Limit: 10, Period: time.Minute}
	keys := make([]byte, 0, 32)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		keys = strconv.AppendInt(append(keys[:0], "api\x00k"...), int64(i), 10)
		m.Decide(ctx, string(keys), flood, 1)
	}
	b.StopTimer()
	if d, _ := m.Decide(ctx, "login\x00victim", victim, 1); d.Allowed {
		b.Fatal("the exhausted key was allowed again after the flood")
	}
	b.ReportMetric(float64(m.Overflows())/float64(b.N), "overflow/op")
}

// BenchmarkWeighted measures what weighted hits and reconciliation cost, in one run: for every
// algorithm, a decision of cost 1, one of cost 37 and one Adjust (alternately a refund of 17
// and an extra charge of 17 of an admitted charge of 37), in alternating rounds (interleave).
// Memory: one hot key from GOMAXPROCS goroutines, ns per operation and allocations of an Adjust
// ("allocs/adjust"). Redis: 64 callers over 1000 keys, operations per second. Limits admit
// everything (the sliding log's is short enough that its log stays under MaxLogLimit).
func BenchmarkWeighted(b *testing.B) {
	ctx := context.Background()
	limitOf := func(a Algorithm, redis bool) Limit {
		l := benchLimit(a)
		switch {
		case redis:
			l = Limit{Algorithm: a, Limit: 1000, Period: 100 * time.Millisecond}
		case a == SlidingLog:
			l.Period = 100 * time.Microsecond
		}
		if a == LeakyBucket {
			l.Burst = l.Limit // a capacity of 1 would not take a cost of 37
		}
		return l
	}
	variants := func(b *testing.B, lim Limiter, redis bool, keys []string) []func(int) error {
		var vs []func(int) error
		for _, a := range Algorithms {
			l := limitOf(a, redis)
			charges := make([]Decision, len(keys))
			for i, k := range keys {
				d, err := lim.Decide(ctx, k, l, 37)
				if err != nil || !d.Allowed {
					b.Fatalf("%s: %s, %v", a, show(d), err)
				}
				charges[i] = d
			}
			vs = append(vs,
				func(i int) error {
					_, err := lim.Decide(ctx, keys[i%len(keys)], l, 1)
					return err
				},
				func(i int) error {
					_, err := lim.Decide(ctx, keys[i%len(keys)], l, 37)
					return err
				},
				func(i int) error {
					used := int64(20)
					if i/len(keys)%2 == 1 {
						used = 54
					}
					return lim.Adjust(ctx, keys[i%len(keys)], l, charges[i%len(keys)], used)
				})
		}
		return vs
	}
	report := func(b *testing.B, rates []float64, unit string, perOp bool) {
		for i, a := range Algorithms {
			for j, what := range []string{"cost1", "cost37", "adjust"} {
				r := rates[3*i+j]
				if perOp {
					r = 1e9 / r
				}
				b.ReportMetric(r, unit+"/"+string(a)+"/"+what)
			}
		}
	}
	b.Run("memory", func(b *testing.B) {
		m := NewMemory(MemoryConfig{})
		vs := variants(b, m, false, []string{"rule:hot"})
		var rates []float64
		for range b.N {
			rates = interleave(b, 20, 200_000, runtime.GOMAXPROCS(0), vs)
		}
		report(b, rates, "ns", true)
		for i, a := range Algorithms {
			b.ReportMetric(testing.AllocsPerRun(1000, func() { _ = vs[3*i+2](0) }), "allocs/"+string(a)+"/adjust")
		}
	})
	b.Run("redis", func(b *testing.B) {
		srv := testenv.Redis(b)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
		b.Cleanup(func() { rdb.Close() })
		r := NewRedis(rdb, RedisConfig{Prefix: "bench:"})
		vs := variants(b, r, true, benchKeys(1000))
		var rates []float64
		for range b.N {
			rates = interleave(b, 10, 4000, 64, vs)
		}
		report(b, rates, "ops/s", false)
	})
}
