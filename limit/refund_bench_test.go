package limit

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// BenchmarkTokenBucketRefund measures what the token bucket's record of levels (peaks.go)
// costs: one operation is a decision of cost 2 and the refund of 1 of it, on one key, from one
// goroutine. With the record short, the bucket refills at once, so each charge finds it full
// and one level is kept; with it full, the bucket loses a token each operation, so each charge
// finds it lower than the last and the record is full (the oldest level dropped each time): the
// most the record costs. Memory, and Redis (two round trips an operation; server-µs/script is
// the time Redis spent in each script, from INFO commandstats, less noisy than the round trips
// on a shared machine). It uses only the package's API, so that the same file runs against
// the code before the record.
func BenchmarkTokenBucketRefund(b *testing.B) {
	ctx := context.Background()
	limits := []struct {
		name string
		l    Limit
	}{
		{"short-record", Limit{Algorithm: TokenBucket, Limit: 1 << 30, Period: time.Millisecond}},
		{"full-record", Limit{Algorithm: TokenBucket, Limit: 1 << 24, Period: 100 * time.Hour}},
	}
	run := func(b *testing.B, lim Limiter, l Limit) {
		b.ReportAllocs()
		for b.Loop() {
			d, err := lim.Decide(ctx, "rule:k", l, 2)
			if err != nil || !d.Allowed {
				b.Fatalf("%+v: %s, %v", l, show(d), err)
			}
			if err := lim.Adjust(ctx, "rule:k", l, d, 1); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, c := range limits {
		b.Run("memory/"+c.name, func(b *testing.B) { run(b, NewMemory(MemoryConfig{}), c.l) })
	}
	srv := testenv.Redis(b)
	for _, c := range limits {
		b.Run("redis/"+c.name, func(b *testing.B) {
			if err := srv.Client.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			run(b, NewRedis(srv.Client, RedisConfig{Prefix: testenv.Prefix(b)}), c.l)
			info, err := srv.Client.Info(ctx, "commandstats").Result()
			if err != nil {
				b.Fatal(err)
			}
			for _, line := range strings.Split(info, "\r\n") {
				if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:"); ok {
					for _, f := range strings.Split(rest, ",") {
						if v, ok := strings.CutPrefix(f, "usec_per_call="); ok {
							x, _ := strconv.ParseFloat(v, 64)
							b.ReportMetric(x, "server-µs/script")
						}
					}
				}
			}
		})
	}
}
