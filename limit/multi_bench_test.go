package limit

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// BenchmarkRedisDecideAll measures a DecideAll of two fixed windows (the two descriptors of
// scripts/bench-rls.sh: a key per caller address, a key per tenant) from 64 concurrent callers
// through the batched store, decided by a script each ("script-each", the store before
// multi.lua) and by one script run ("one-run"), in alternating rounds on one redis-server.
// Metrics per call: redis-server's CPU time (INFO cpu), Redis's time in the scripts
// (commandstats), this process's CPU time (client: the store and go-redis), and calls/s; on a
// shared machine the CPU times are what other load disturbs least.
func BenchmarkRedisDecideAll(b *testing.B) {
	srv := testenv.Redis(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	b.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	perSecond := Limit{Algorithm: FixedWindow, Limit: 1 << 40, Period: time.Second}
	perMinute := Limit{Algorithm: FixedWindow, Limit: 1 << 40, Period: time.Minute}
	each := NewRedis(rdb, RedisConfig{Prefix: "bench:"})
	each.grouping = groupNone
	one := NewRedis(rdb, RedisConfig{Prefix: "bench:"})
	variants := []struct {
		name string
		r    *Redis
	}{{"script-each", each}, {"one-run", one}}
	call := func(r *Redis, i int) error {
		_, err := r.DecideAll(ctx, []Request{
			{Key: "rls:bench\x1fremote_address=10." + strconv.Itoa(i), Limit: perSecond, Cost: 1},
			{Key: "rls:bench\x1ftenant=t" + strconv.Itoa(i%50) + "\x1fpath=/v1/orders", Limit: perMinute, Cost: 1},
		})
		return err
	}
	for _, v := range variants { // the scripts loaded, the connections made
		for i := range 64 {
			if err := call(v.r, i); err != nil {
				b.Fatal(err)
			}
		}
	}
	const rounds, ops, callers = 6, 4000, 64
	type totals struct {
		wall, redisCPU, scripts, client time.Duration
	}
	sum := make([]totals, len(variants))
	for range b.N {
		for range rounds {
			for v := range variants {
				rc0, sc0, cc0 := redisCPU(b, rdb), scriptTime(b, rdb), cpuTime()
				start := time.Now()
				var wg sync.WaitGroup
				for g := range callers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := g; i < ops; i += callers {
							if err := call(variants[v].r, i); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				s := &sum[v]
				s.wall += time.Since(start)
				s.client += cpuTime() - cc0
				s.redisCPU += redisCPU(b, rdb) - rc0
				s.scripts += scriptTime(b, rdb) - sc0
			}
		}
	}
	calls := float64(b.N * rounds * ops)
	for v, s := range sum {
		n := variants[v].name
		b.ReportMetric(calls/s.wall.Seconds(), "calls/s/"+n)
		b.ReportMetric(float64(s.redisCPU.Microseconds())/calls, "redis-cpu-µs/call/"+n)
		b.ReportMetric(float64(s.scripts.Microseconds())/calls, "redis-script-µs/call/"+n)
		b.ReportMetric(float64(s.client.Microseconds())/calls, "client-cpu-µs/call/"+n)
	}
}

// redisCPU is the CPU time redis-server has used, user and system (INFO cpu).
func redisCPU(b *testing.B, rdb *redis.Client) time.Duration {
	var total time.Duration
	for _, f := range []string{"used_cpu_sys", "used_cpu_user"} {
		total += time.Duration(infoField(b, rdb, "cpu", f) * 1e9)
	}
	return total
}

// scriptTime is the time Redis has spent in EVALSHA and EVAL (INFO commandstats).
func scriptTime(b *testing.B, rdb *redis.Client) time.Duration {
	var total time.Duration
	for _, c := range []string{"cmdstat_evalsha", "cmdstat_eval"} {
		total += time.Duration(infoField(b, rdb, "commandstats", c+".usec")) * time.Microsecond
	}
	return total
}

// infoField reads a number from a section of INFO: field, or "line.key" for a key inside a
// line of key=value pairs (commandstats); 0 when absent.
func infoField(b *testing.B, rdb *redis.Client, section, field string) float64 {
	text, err := rdb.Info(context.Background(), section).Result()
	if err != nil {
		b.Fatal(err)
	}
	line, key, _ := strings.Cut(field, ".")
	for _, l := range strings.Split(text, "\r\n") {
		name, value, ok := strings.Cut(l, ":")
		if !ok || name != line {
			continue
		}
		if key != "" {
			for _, kv := range strings.Split(value, ",") {
				if k, v, ok := strings.Cut(kv, "="); ok && k == key {
					value = v
					break
				}
			}
		}
		f, _ := strconv.ParseFloat(value, 64)
		return f
	}
	return 0
}

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
