package limit

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// BenchmarkChargeID measures what recording charge IDs costs (issue 39), before and after in
// one run: extra charges (Adjust of a charge of 37 at 38) without a ChargeID, as every charge
// was made before, and with a fresh one each, in alternating rounds (interleave), for a bucket
// and a window. Memory: one hot key from GOMAXPROCS goroutines, ns per Adjust. Redis: 64
// callers over 1000 keys, Adjusts per second, the server's µs per Adjust script (INFO
// commandstats), and the bytes one key's record of charges holds per ID (MEMORY USAGE of the
// sorted set over its size).
func BenchmarkChargeID(b *testing.B) {
	ctx := context.Background()
	algs := []Algorithm{TokenBucket, SlidingWindow}
	limitOf := func(a Algorithm) Limit { return Limit{Algorithm: a, Limit: 1 << 30, Period: time.Second} }
	variants := func(b *testing.B, lim Limiter, keys []string) []func(int) error {
		var vs []func(int) error
		for _, a := range algs {
			l := limitOf(a)
			charges := make([]Decision, len(keys))
			for i, k := range keys {
				d, err := lim.Decide(ctx, k, l, 37)
				if err != nil || !d.Allowed {
					b.Fatalf("%s: %s, %v", a, show(d), err)
				}
				charges[i] = d
			}
			for _, marked := range []bool{false, true} {
				vs = append(vs, func(i int) error {
					d := charges[i%len(keys)]
					if marked {
						d.ChargeID = rand.Uint64() | 1
					}
					return lim.Adjust(ctx, keys[i%len(keys)], l, d, 38)
				})
			}
		}
		return vs
	}
	report := func(b *testing.B, rates []float64, unit string, perOp bool) {
		for i, a := range algs {
			for j, what := range []string{"without", "with"} {
				r := rates[2*i+j]
				if perOp {
					r = 1e9 / r
				}
				b.ReportMetric(r, unit+"/"+string(a)+"/"+what)
			}
			b.ReportMetric(rates[2*i+1]/rates[2*i], "x-"+string(a))
		}
	}
	b.Run("memory", func(b *testing.B) {
		m := NewMemory(MemoryConfig{})
		vs := variants(b, m, []string{"rule:hot"})
		var rates []float64
		for range b.N {
			rates = interleave(b, 40, 50_000, runtime.GOMAXPROCS(0), vs)
		}
		report(b, rates, "ns", true)
	})
	b.Run("redis", func(b *testing.B) {
		srv := testenv.Redis(b)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
		b.Cleanup(func() { rdb.Close() })
		r := NewRedis(rdb, RedisConfig{Prefix: "bench:"})
		keys := benchKeys(1000)
		vs := variants(b, r, keys)
		var rates []float64
		for range b.N {
			rates = interleave(b, 30, 2000, 64, vs)
		}
		report(b, rates, "ops/s", false)
		// The server's own time per script (INFO commandstats), which the load of other
		// processes on the machine hardly moves: the variants run apart, 10 000 Adjusts each.
		for i, a := range algs {
			for j, what := range []string{"without", "with"} {
				calls0, usec0 := evalshaStats(b, rdb)
				interleave(b, 1, 10_000, 64, vs[2*i+j:2*i+j+1])
				calls1, usec1 := evalshaStats(b, rdb)
				b.ReportMetric(float64(usec1-usec0)/float64(calls1-calls0), "server-µs/"+string(a)+"/"+what)
			}
		}
		marks := r.key(keys[0], algTokenBucket) + ":c"
		n, err1 := rdb.ZCard(ctx, marks).Result()
		bytes, err2 := rdb.MemoryUsage(ctx, marks).Result()
		if err1 != nil || err2 != nil || n == 0 {
			b.Fatalf("the record of charges of %s: %d IDs, %v, %v", keys[0], n, err1, err2)
		}
		b.ReportMetric(float64(bytes)/float64(n), "bytes/mark")
		b.ReportMetric(float64(n), "marks/key")
	})
}

// evalshaStats returns the EVALSHA calls the server has run and the µs it spent in them.
func evalshaStats(b *testing.B, rdb *redis.Client) (calls, usec int64) {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	_, rest, _ := strings.Cut(info, "cmdstat_evalsha:")
	line, _, _ := strings.Cut(rest, "\r\n")
	for _, f := range strings.Split(line, ",") {
		k, v, _ := strings.Cut(f, "=")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "calls":
			calls = n
		case "usec":
			usec = n
		}
	}
	return calls, usec
}
